// The fixture of kernel tests that run once per ISA tier (GetParam()), skipped with the reason
// where this CPU cannot run the tier, and the instantiation over every tier.
//
//   using PoolTest = PerIsaTest;
//   SPARSECOL_EVERY_ISA(PoolTest);
//   TEST_P(PoolTest, MatchesReference) { const kernels::Isa isa = GetParam(); ... }
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "isa.h"

namespace sparsecol::testing {

class PerIsaTest : public ::testing::TestWithParam<kernels::Isa> {
 protected:
  void SetUp() override {
    if (!kernels::isa_available(GetParam())) {
      GTEST_SKIP() << to_string(GetParam()) << " cannot run here: " << kernels::isa_reason();
    }
  }
};

}  // namespace sparsecol::testing

#define SPARSECOL_EVERY_ISA(suite)                                                              \
  INSTANTIATE_TEST_SUITE_P(                                                                     \
      EveryIsa, suite,                                                                          \
      ::testing::Values(::sparsecol::kernels::Isa::kPortable, ::sparsecol::kernels::Isa::kAvx2, \
                        ::sparsecol::kernels::Isa::kAvx512),                                    \
      [](const ::testing::TestParamInfo<::sparsecol::kernels::Isa>& info) {                     \
        return std::string(to_string(info.param));                                              \
      })
