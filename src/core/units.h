// Sizes as numbers and as text: one definition of a GiB, one way to print a byte count.
#pragma once

#include <string>

namespace h2 {

inline constexpr double kBytesPerGiB = 1073741824.0;

// "1.50 GiB", "12.0 MiB", "3.0 KiB", "512 B": sizes as people read them in messages and tables.
std::string format_bytes(double bytes);

}  // namespace h2
