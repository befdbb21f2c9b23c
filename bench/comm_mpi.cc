// Open MPI's side of `h2 bench comm`: the same loop (comm_loop.h) through MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block and MPI_Sendrecv; started by mpirun; rank 0 appends CSV lines to argv[1].
#include <mpi.h>

#include <cstdio>

#include "comm_loop.h"

namespace {

struct MpiOps {
  int rank_ = 0, size_ = 1;
  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  double max(double x) {
    double out = 0;
    MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
  void run(const std::string& op, float* a, float* b, size_t count) {
    const int c = static_cast<int>(count);
    if (op == "all_reduce") {
      MPI_Allreduce(MPI_IN_PLACE, a, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "all_gather") {
      MPI_Allgather(a, c, MPI_FLOAT, b, c, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op == "reduce_scatter") {
      MPI_Reduce_scatter_block(a, b, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      MPI_Sendrecv(a, c, MPI_FLOAT, (rank_ + 1) % size_, 1, b, c, MPI_FLOAT, (rank_ + size_ - 1) % size_, 1,
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MpiOps ops;
  MPI_Comm_rank(MPI_COMM_WORLD, &ops.rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &ops.size_);
  FILE* out = ops.rank_ == 0 && argc > 1 ? std::fopen(argv[1], "a") : nullptr;
  h2::bench::comm_loop(ops, "openmpi", out);
  if (out != nullptr) std::fclose(out);
  MPI_Finalize();
  return 0;
}
