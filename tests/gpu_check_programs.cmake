# The programs the GPU check (scripts/gpu-check.sh) carries to a GPU machine, and their tests: included by
# tests/CMakeLists.txt in every build, and alone in the lean build (-DZERO_LEAN=ON) that the check falls back on.

# ---- Unit tests (single process) -----------------------------------------------------------------------------
add_executable(zero_unit_tests unit/aio_test.cpp unit/config_test.cpp unit/layout_test.cpp unit/plan_test.cpp unit/device_plan_test.cpp unit/offload_pipeline_test.cpp unit/engine_test.cpp unit/kernels_test.cpp unit/launch_table_test.cpp unit/rank_order_sum_test.cpp
                               unit/schedule_test.cpp unit/checkpoint_io_test.cpp unit/deepspeed_test.cpp
                               unit/fetch_ahead_test.cpp unit/gather_state_test.cpp unit/tcp_link_test.cpp
                               unit/hierarchy_tcp_test.cpp unit/shared_arena_test.cpp unit/accumulator_test.cpp
                               unit/fixture_paths.cpp)
# DeepSpeed's own numbers, recorded by tests/deepspeed/make_fixtures.py (tests/deepspeed/README.md): the path is
# defined for one small file only, so that the other files' compile commands are the same in every clone.
set_source_files_properties(unit/fixture_paths.cpp PROPERTIES COMPILE_DEFINITIONS
                            ZERO_DEEPSPEED_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/deepspeed/fixtures.json")
# The fp16 rounding test compares with the F16C instructions, in functions of their own (target attribute); it
# skips itself on a CPU without them.
target_link_libraries(zero_unit_tests PRIVATE zero_core GTest::gtest_main)
target_compile_options(zero_unit_tests PRIVATE ${ZERO_WARNINGS})
# The I/O engine's tests write under the NVMe scratch directory (on the build tree's disk: O_DIRECT), and fail
# rather than skip where it lacks O_DIRECT.
gtest_discover_tests(zero_unit_tests TEST_PREFIX unit. DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS unit ENVIRONMENT ZERO_TEST_NVME_DIR=${ZERO_TEST_NVME_DIR})
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_SOURCE_DIR}/unit/unit_costs.cmake)

# ---- The C API over the engine with fault injection (zero_core_testing: core/util/test_hooks.hpp), as a static
# library: only the tests that inject failures link it; every other test runs the shipped libzero.so.
zero_static_capi(zero_testing zero_core_testing)

# ---- Parity without MPI: tests/mpi/parity.c built with ZERO_TEST_WITHOUT_MPI for the GPU check's machine, which has
# no MPI (a launcher starts the ranks, as torchrun does). The GPU check runs it on the GPU at 1-3 processes over shared
# memory and over NCCL; here over the emulator (several processes: the host-staged path), every stage.
add_executable(test_parity_launch mpi/parity.c)
target_compile_definitions(test_parity_launch PRIVATE ZERO_TEST_WITHOUT_MPI)
target_link_libraries(test_parity_launch PRIVATE zero m)
target_compile_options(test_parity_launch PRIVATE ${ZERO_WARNINGS})
foreach(world 1 2 3)
  foreach(stage 0 1 2 3)
    set(name launch.parity.device-emulator.bf16.n${world}.stage${stage})
    add_test(NAME ${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/shm_launch.sh ${world} -1
                                  $<TARGET_FILE:test_parity_launch> --job @JOB@ --comm shm --device emulator
                                  --stage ${stage} --gas 3 --dtype bf16 --partial 1)
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 120)
  endforeach()
endforeach()

# ---- One rank failing, without MPI: tests/mpi/failures.c built with ZERO_TEST_WITHOUT_MPI (the GPU check runs it on
# the GPU, host-staged and over NCCL). Here a device engine on the emulator at 2 and 3 processes, host-staged: a rank
# fails before a collective (its own error, the others ZERO_ERR_REMOTE, the engines usable), inside a group in
# flight, or stalls.
add_executable(test_failures_launch mpi/failures.c)
target_compile_definitions(test_failures_launch PRIVATE ZERO_TEST_WITHOUT_MPI)
target_link_libraries(test_failures_launch PRIVATE zero_testing Threads::Threads m)
target_compile_options(test_failures_launch PRIVATE ${ZERO_WARNINGS})
foreach(world 2 3)
  foreach(case "fail-at:gather;3" "fail-at:bucket;2" "fail-at:step;2" "fail-in-group;2" "fail-in-flight;2"
               "stall;1")
    list(GET case 0 scenario)
    list(GET case 1 stage)
    string(REPLACE ":" "." tag ${scenario})
    set(name launch.failures.device-emulator.${tag}.n${world})
    add_test(NAME ${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/shm_launch.sh ${world} -1
                                  $<TARGET_FILE:test_failures_launch> --scenario ${scenario} --stage ${stage}
                                  --shm-name @JOB@ --device emulator)
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 120)
  endforeach()
endforeach()

# ---- The device runtime (core/device) and the engine's device memory over it: on the host emulator everywhere, on
# CUDA where a GPU is (the gpu label; without a device those report themselves skipped with the runtime's reason).
add_executable(test_device_runtime device/runtime_test.cpp device/memory_test.cpp device/engine_test.cpp
                                   device/offload_test.cpp)
target_include_directories(test_device_runtime PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
target_link_libraries(test_device_runtime PRIVATE zero_core GTest::gtest_main)
target_compile_options(test_device_runtime PRIVATE ${ZERO_WARNINGS})
add_test(NAME unit.device.emulator COMMAND test_device_runtime --gtest_filter=*emulator*:DeviceEmulator*:DeviceEngineFaults*)
set_tests_properties(unit.device.emulator PROPERTIES LABELS unit TIMEOUT 300)
# The device engine through the C API, on the emulator (and "cuda" refused clearly where there is no device).
add_executable(test_capi_device device/capi_device.c)
target_include_directories(test_capi_device PRIVATE ${CMOCKA_INCLUDE_DIR})
target_link_libraries(test_capi_device PRIVATE zero ${CMOCKA_LIBRARY})
target_compile_options(test_capi_device PRIVATE ${ZERO_WARNINGS} -pedantic)
add_test(NAME unit.device.capi COMMAND test_capi_device)
set_tests_properties(unit.device.capi PROPERTIES LABELS unit TIMEOUT 300)
if(ZERO_CUDA AND NOT ZERO_LEAN)
  # The GPU check's bundle (scripts/gpu-check.sh): collected from this build within its size, and its --run half
  # on the emulator — the GPU halves load and report themselves skipped; with the torch venv, libzero.torch's
  # package compiled from the bundle and its launches on the CPU.
  set(gpu_check_python "")
  if(ZERO_TORCH_PYTHON)
    set(gpu_check_python "--python ${ZERO_TORCH_PYTHON}")
  endif()
  add_test(NAME unit.gpu-check.bundle
           COMMAND bash -c "export PATH=/usr/local/cuda/bin:$PATH && bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh --prepare --build ${PROJECT_BINARY_DIR} --out ${CMAKE_CURRENT_BINARY_DIR}/gpu-bundle && bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh --run --bundle ${CMAKE_CURRENT_BINARY_DIR}/gpu-bundle --emulator ${gpu_check_python}")
  set_tests_properties(unit.gpu-check.bundle PROPERTIES LABELS unit TIMEOUT 600 FIXTURES_SETUP gpu-bundle)
  # The fallback build the check makes where the prebuilt programs do not load, from the bundle's vendored headers
  # and without MPI, then the same --run half (about 2 minutes on 2 cores; every core).
  add_test(NAME unit.gpu-check.lean
           COMMAND bash -c "export PATH=/usr/local/cuda/bin:$PATH && bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh --run --bundle ${CMAKE_CURRENT_BINARY_DIR}/gpu-bundle --emulator --lean --lean-dir ${CMAKE_CURRENT_BINARY_DIR}/gpu-lean")
  set_tests_properties(unit.gpu-check.lean PROPERTIES LABELS unit TIMEOUT 1200 FIXTURES_REQUIRED gpu-bundle
                                                      PROCESSORS ${ZERO_TEST_HEAVY} COST 200)
endif()
if(ZERO_CUDA)
  add_test(NAME gpu.device-runtime COMMAND test_device_runtime --gtest_filter=*cuda*)
  set_tests_properties(gpu.device-runtime PROPERTIES LABELS gpu TIMEOUT 300 SKIP_REGULAR_EXPRESSION "no CUDA device: "
                       ENVIRONMENT ZERO_CUDA_MODULE=$<TARGET_FILE:zero_cuda_module>)
  add_dependencies(test_device_runtime zero_cuda_module)
endif()

# ---- The GPU kernels against the CPU's, bit for bit (-DZERO_CUDA=ON). Without a CUDA device every test reports
# itself skipped with the runtime's reason, and CTest shows the run as skipped. Label "gpu" (scripts/gpu-check.sh).
if(ZERO_CUDA)
  add_executable(test_gpu_kernels gpu/kernels_test.cpp)
  target_link_libraries(test_gpu_kernels PRIVATE zero_cuda_kernels zero_core GTest::gtest_main)
  target_compile_options(test_gpu_kernels PRIVATE ${ZERO_WARNINGS})
  add_test(NAME gpu.kernels COMMAND test_gpu_kernels --gtest_filter=Gpu.*)
  set_tests_properties(gpu.kernels PROPERTIES LABELS gpu TIMEOUT 300 SKIP_REGULAR_EXPRESSION "no CUDA device: ")
  # The argument checks run before any device is touched, so they run (and can fail) on every machine; a separate
  # entry keeps the skip expression above from hiding them.
  add_test(NAME unit.GpuArguments COMMAND test_gpu_kernels --gtest_filter=GpuArguments.*)
  set_tests_properties(unit.GpuArguments PROPERTIES LABELS unit TIMEOUT 60)
  # No floating-point instruction that ptxas could fuse, even under nvcc's default -fmad=true.
  add_test(NAME lint.cuda-rounding
           COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check-cuda-rounding.sh ${CMAKE_CUDA_COMPILER}
                   ${CMAKE_CUDA_ARCHITECTURES} ${PROJECT_BINARY_DIR}/include)
  set_tests_properties(lint.cuda-rounding PROPERTIES LABELS lint TIMEOUT 300)
endif()

