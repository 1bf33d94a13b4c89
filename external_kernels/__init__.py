"""The C++ kernels: the AIE2P external kernels (*.cc, kernel_common.h) compiled with Peano, the host kernels
(host/*.cc) and their host build (host_build); paths names where they and the caches are."""
