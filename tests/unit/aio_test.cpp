// The direct-I/O engines of NVMe offload (core/nvme/aio.hpp): both engines move every byte at every block size and
// queue depth, and each fault a disk can show — no space at pre-allocation, a file truncated under the engine, a
// request outside the rules — is a clear error, never a silent short read.
#include "nvme/aio.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "nvme/nvme_state.hpp"
#include "util/error.hpp"

namespace zero {
namespace io {
namespace {

// Where the tests put their files: ZERO_TEST_NVME_DIR (CTest sets it to a directory on the build tree's disk) or,
// run by hand, the working directory. It must support O_DIRECT (tmpfs, which some /tmp are, does not before Linux
// 6.6): without it these tests fail instead of skipping, so that a machine where they cannot run shows up as one.
std::string scratch(const std::string& name) {
  const char* env = std::getenv("ZERO_TEST_NVME_DIR");
  const std::filesystem::path dir =
      (env != nullptr && env[0] != '\0' ? std::filesystem::path(env) : std::filesystem::current_path()) / "aio-test";
  std::filesystem::create_directories(dir);
  return (dir / (name + "-" + std::to_string(::getpid()))).string();
}

std::vector<EngineKind> engines() {
  std::vector<EngineKind> kinds{EngineKind::kPosix};
  try {
    if (std::string(make_engine(AioSettings{}, EngineKind::kIoUring)->name()) == "io_uring")
      kinds.push_back(EngineKind::kIoUring);
  } catch (const Error&) {
    // built without liburing, or the kernel forbids io_uring: the fallback is tested alone
  }
  return kinds;
}

void fill(AlignedBuffer& b, uint32_t seed) {
  auto* words = static_cast<uint32_t*>(b.data());
  for (size_t i = 0; i < b.size() / 4; ++i) words[i] = seed * 2654435761u + static_cast<uint32_t>(i);
}

TEST(Aio, EveryEngineMovesEveryByte) {
  const size_t bytes = 3 * (1 << 20) + 12 * 1024;  // not a multiple of the block size
  for (EngineKind kind : engines()) {
    for (size_t block : {size_t{4096}, size_t{256 * 1024}, size_t{1 << 20}}) {
      for (int depth : {1, 3, 8}) {
        const std::string path = scratch("roundtrip");
        std::unique_ptr<DirectFile> file;
        file = std::make_unique<DirectFile>(DirectFile::create(path, bytes + 8192));
        auto engine = make_engine(AioSettings{block, depth}, kind);
        AlignedBuffer out(bytes), in(bytes);
        fill(out, static_cast<uint32_t>(block + static_cast<size_t>(depth)));
        engine->write(*file, out.data(), bytes, 8192);
        engine->read(*file, in.data(), bytes, 8192);
        ASSERT_EQ(0, std::memcmp(out.data(), in.data(), bytes)) << engine->name() << " block " << block;
        // A batch of several transfers before one finish (how a pipelined step uses it).
        AlignedBuffer half(bytes / 2 / 4096 * 4096);
        engine->start_read(*file, half.data(), half.size(), 8192);
        engine->start_write(*file, out.data(), 4096, 0);
        engine->finish();
        ASSERT_EQ(0, std::memcmp(out.data(), half.data(), half.size()));
        std::filesystem::remove(path);
      }
    }
  }
}

TEST(Aio, TransfersOutsideTheRulesAreRefused) {
  const std::string path = scratch("rules");
  std::unique_ptr<DirectFile> file;
  file = std::make_unique<DirectFile>(DirectFile::create(path, 65536));
  EXPECT_EQ(65536u, file->size());
  AlignedBuffer buf(65536);
  for (EngineKind kind : engines()) {
    auto engine = make_engine(AioSettings{}, kind);
    try {
      engine->read(*file, static_cast<char*>(buf.data()) + 512, 4096, 0);
      ADD_FAILURE() << "a misaligned buffer was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(ZERO_ERR_INVALID_ARGUMENT, e.status());
      EXPECT_NE(std::string::npos, std::string(e.what()).find("multiples of 4096")) << e.what();
    }
    try {
      engine->write(*file, buf.data(), 8192, 61440);
      ADD_FAILURE() << "a write past the end was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(ZERO_ERR_IO, e.status());
      EXPECT_NE(std::string::npos, std::string(e.what()).find("past its end")) << e.what();
    }
  }
  try {
    make_engine(AioSettings{1000, 8});
    ADD_FAILURE() << "a block size that is not a multiple of 4096 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(ZERO_ERR_CONFIG, e.status());
  }
  std::filesystem::remove(path);
}

// The file shrinks under the engine (another process truncated it): a read beyond the new end gets 0 bytes, which
// must be an error naming the file and the offset, not zeros passed off as data.
TEST(Aio, ATruncatedFileIsAnErrorNotZeros) {
  for (EngineKind kind : engines()) {
    const std::string path = scratch("truncated");
    std::unique_ptr<DirectFile> file;
    file = std::make_unique<DirectFile>(DirectFile::create(path, 1 << 20));
    ASSERT_EQ(0, ::truncate(path.c_str(), 65536));
    auto engine = make_engine(AioSettings{65536, 4}, kind);
    AlignedBuffer buf(1 << 19);
    try {
      engine->read(*file, buf.data(), buf.size(), 1 << 19);
      ADD_FAILURE() << engine->name() << ": a read past the truncated end succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(ZERO_ERR_IO, e.status());
      EXPECT_NE(std::string::npos, std::string(e.what()).find("shorter than expected")) << e.what();
      EXPECT_NE(std::string::npos, std::string(e.what()).find(path)) << e.what();
    }
    // The engine is still usable for the bytes that are there.
    engine->read(*file, buf.data(), 65536, 0);
    std::filesystem::remove(path);
  }
}

// No space for the file: pre-allocation fails at creation (here through a file-size limit, which the kernel
// reports as EFBIG), with the path and a hint, and leaves no file behind.
TEST(Aio, NoSpaceFailsAtCreationNotMidStep) {
  struct rlimit old {};
  ASSERT_EQ(0, ::getrlimit(RLIMIT_FSIZE, &old));
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(0, ::sigaction(SIGXFSZ, &ignore, &previous));
  struct rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(0, ::setrlimit(RLIMIT_FSIZE, &small));
  const std::string path = scratch("nospace");
  std::string message;
  zero_status_t status = ZERO_OK;
  try {
    DirectFile::create(path, 8 << 20);
  } catch (const Error& e) {
    message = e.what();
    status = e.status();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_EQ(ZERO_ERR_IO, status) << message;
  EXPECT_NE(std::string::npos, message.find("reserving")) << message;
  EXPECT_NE(std::string::npos, message.find("free space")) << message;
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A state file never overwrites another: created exclusively, an existing name is EEXIST, not a truncation.
TEST(Aio, ExclusiveCreationNeverTruncatesAnotherFile) {
  const std::string path = scratch("exclusive");
  std::unique_ptr<DirectFile> first;
  first = std::make_unique<DirectFile>(DirectFile::create(path, 8192, true));
  try {
    DirectFile::create(path, 8192, true);
    ADD_FAILURE() << "a second exclusive creation of " << path << " succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("(errno " + std::to_string(EEXIST) + ")")) << e.what();
  }
  EXPECT_EQ(8192u, first->size());
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace io
}  // namespace zero

namespace zero {
namespace io {
namespace {

// The NVMe state's pipelined pass (core/nvme/nvme_state.hpp) visits every element of every unit exactly once, in unit
// order, and what the update writes reaches the file — with units that chunks cut anywhere, empty units, windows of
// 1 to 5 chunks and both engines; reads and writes at unaligned offsets keep their neighbours (also under ASan).
TEST(NvmeState, TheStreamedPassUpdatesEveryElementOnce) {
  const std::vector<size_t> units = {5000, 1, 0, 3000, 1025, 7};
  for (EngineKind kind : engines()) {
    setenv("ZERO_AIO_ENGINE", kind == EngineKind::kPosix ? "posix" : "io_uring", 1);
    for (int buffers : {1, 2, 3, 5}) {
      const NvmeState::Geometry g = NvmeState::geometry(units, 2, 1500, buffers);
      std::unique_ptr<NvmeState> state;
      AioSettings aio;
      aio.block_size = 8192;
      aio.queue_depth = 3;
      const std::string dir = std::filesystem::path(scratch("nvme-state")).parent_path().string();
      state = std::make_unique<NvmeState>(dir, "state-" + std::to_string(::getpid()) + "-" + std::to_string(buffers), g,
                                          aio, 0);
      // Array a of unit u holds u * 1e6 + a * 1e5 + i, written in odd pieces.
      for (size_t u = 0; u < units.size(); ++u)
        for (int a = 0; a < 2; ++a)
          for (size_t i = 0; i < units[u]; i += 333) {
            std::vector<float> v(std::min<size_t>(333, units[u] - i));
            for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(u * 1000000 + a * 100000 + i + k);
            state->write(static_cast<int>(u), a, i, v.data(), v.size());
          }
      std::vector<std::vector<int>> visits(units.size());
      for (size_t u = 0; u < units.size(); ++u) visits[u].assign(units[u], 0);
      int last_unit = -1;
      state->stream([&](const NvmeState::Piece& p, float* const* arrays) {
        EXPECT_GE(p.unit, last_unit);
        last_unit = p.unit;
        for (size_t k = 0; k < p.n; ++k) {
          const size_t i = p.begin + k;
          visits[p.unit][i] += 1;
          for (int a = 0; a < 2; ++a) {
            EXPECT_EQ(arrays[a][k], static_cast<float>(p.unit * 1000000 + a * 100000 + i));
            arrays[a][k] = -arrays[a][k];
          }
        }
      });
      for (size_t u = 0; u < units.size(); ++u) {
        for (size_t i = 0; i < units[u]; ++i) ASSERT_EQ(visits[u][i], 1) << "unit " << u << " element " << i;
        for (int a = 0; a < 2; ++a) {
          std::vector<float> back(units[u] + 1);
          state->read(static_cast<int>(u), a, 0, back.data(), units[u]);
          for (size_t i = 0; i < units[u]; ++i)
            ASSERT_EQ(back[i], -static_cast<float>(u * 1000000 + a * 100000 + i))
                << "buffers " << buffers << " unit " << u << " array " << a << " element " << i;
        }
      }
    }
    unsetenv("ZERO_AIO_ENGINE");
  }
}

}  // namespace
}  // namespace io
}  // namespace zero
