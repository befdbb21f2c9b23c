// Shapes and tensor views.
#include "core/tensor.h"

#include <memory>

#include "test_util.h"

namespace h2 {
namespace {

using testing_util::error_of;

TEST(Shape, CountsAndPrints) {
  const Shape s{4, 256, 768};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 4 * 256 * 768);
  EXPECT_EQ(s.str(), "[4, 256, 768]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{3, 0}.numel()), 0);
  EXPECT_EQ(s.with_dim(0, 2), (Shape{2, 256, 768}));
  error_of([] { Shape{2, -1}; }, ErrorCode::kInvalidArgument);
  error_of([] { Shape{1, 1, 1, 1, 1, 1, 1}; }, ErrorCode::kInvalidArgument);
}

TEST(Tensor, SliceAndReshapeShareStorage) {
  // Host storage without a device: core needs none.
  std::shared_ptr<void> storage(new float[12], [](void* p) { delete[] static_cast<float*>(p); });
  Tensor t(storage, nullptr, 0, DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) t.data_as<float>()[i] = static_cast<float>(i);
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data_as<float>()[0], 3.0f);
  Tensor flat = rows.reshape({6});
  EXPECT_EQ(flat.data_as<float>()[5], 8.0f);
  EXPECT_THAT(error_of([&] { t.slice(2, 5); }, ErrorCode::kInvalidArgument), ::testing::HasSubstr("out of range"));
  EXPECT_THAT(error_of([&] { t.reshape({5}); }, ErrorCode::kInvalidArgument),
              ::testing::HasSubstr("element counts differ"));
}

}  // namespace
}  // namespace h2
