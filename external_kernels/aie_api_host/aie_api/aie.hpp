// Host stand-in for aie_api's <aie_api/aie.hpp> (llama-npu, external_kernels/aie_api_host): the subset of aie_api
// the external kernels use, for AIE2P, with instruction counters. See docs/aie-api-host.md.
#pragma once

#include "host/core.hpp"
#include "host/vector.hpp"
#include "host/arith.hpp"
#include "host/mmul.hpp"
#include "host/int4.hpp"
