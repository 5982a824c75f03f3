"""The Hugging Face Trainer on libzero: a DeepSpeed user's script with one import changed (README.md shows these
lines). A small Llama built from its config learns to continue counting sequences, at ZeRO stage 3 with
examples/python/ds_config.json, whose "auto" values the Trainer's arguments fill in.

    python examples/python/hf_trainer.py                                   # one process
    torchrun --standalone --nproc-per-node 2 examples/python/hf_trainer.py  # two (gloo), no MPI needed
"""

import os
import shutil
import sys
import tempfile

import torch
import transformers

# The run's directory (the first argument, or a new temporary one) with the config beside the outputs.
run = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="libzero-hf-trainer-")
os.makedirs(run, exist_ok=True)
shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds_config.json"), run)
os.chdir(run)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=32, max_position_embeddings=16))


class Counting(torch.utils.data.Dataset):
    """Sequences that count up modulo the vocabulary from a random start."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        start = torch.randint(0, 32, (1,), generator=torch.Generator().manual_seed(i))
        ids = (start + torch.arange(16)) % 32
        return {"input_ids": ids, "labels": ids.clone()}


train_dataset = Counting()

from libzero.transformers import Trainer, TrainingArguments   # was: from transformers import ...

args = TrainingArguments(output_dir="out", deepspeed="ds_config.json", per_device_train_batch_size=4,
                         gradient_accumulation_steps=4, learning_rate=3e-3, bf16=True, use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
trainer.train()
trainer.save_model("out/final")

# What was saved loads back with transformers alone, and has learned to count.
if trainer.args.process_index == 0:
    trained = transformers.LlamaForCausalLM.from_pretrained("out/final")
    ids = torch.stack([train_dataset[i]["input_ids"] for i in range(64)])
    with torch.no_grad():
        right = (trained(input_ids=ids).logits[:, :-1].argmax(-1) == ids[:, 1:]).float().mean().item()
    print(f"train loss {trainer.state.log_history[-1]['train_loss']:.3f}; next tokens right: {100 * right:.1f} % "
          f"(in {run})")
