// How a loss kernel reduces its per-element (or per-row) losses. Plain C++, shared by cuda_ops/ and csrc/.
#pragma once

namespace torchext::cuda_ops {

enum class LossReduction : int { None = 0, Mean = 1, Sum = 2 };

}  // namespace torchext::cuda_ops
