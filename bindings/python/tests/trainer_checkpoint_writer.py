"""Run under torchrun by test_trainer.py's rank-count test: trains test_trainer's model and data at stage 3 for 4
steps, saves a Trainer checkpoint at step 4 under <dir>, and writes the trained weights to <dir>/weights.pt (rank 0).

    torchrun --standalone --nproc-per-node N trainer_checkpoint_writer.py DIR"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_trainer as t  # noqa: E402 - initialises torch.distributed under torchrun

import libzero.transformers as lzt_tf  # noqa: E402

directory = sys.argv[1]
args = lzt_tf.TrainingArguments(output_dir=directory, deepspeed=t.ds_config(3), per_device_train_batch_size=2,
                                 gradient_accumulation_steps=2, max_steps=4, learning_rate=1e-2, save_strategy="steps",
                                 save_steps=4, report_to=[], use_cpu=True, seed=0, data_seed=0)
trainer = lzt_tf.Trainer(model=t.model(), args=args, train_dataset=t.Data(26))
trainer.train()
weights = trainer.libzero_engine.full_parameters()  # collective
if t.RANK == 0:
    torch.save(weights, os.path.join(directory, "weights.pt"))
trainer.libzero_engine.close()
t.teardown_module()
