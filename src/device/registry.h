// The one list of device backends (explicit registration, no static initialisers; docs/architecture.md, "adding a
// backend"). Adding a backend: a folder under device/ and ops/, one entry in registry.cc, one build option.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/emu/device.h"

namespace h2 {

struct BackendInfo {
  const char* name;
  const char* description;
};

// In registration order: ref, cpu, emu, and cuda when built with the CUDA toolkit (H2_CUDA).
const std::vector<BackendInfo>& backends();

// One line per accelerator a built backend finds on this machine (cuda: each GPU with its memory and compute
// capability, or why there is none); empty when no such backend is built.
std::vector<std::string> hardware_lines();

struct DeviceSpec {
  std::string backend;                       // a name from backends()
  int index = 0;                             // device number within the backend, for its name
  std::optional<size_t> mem_capacity_bytes;  // ref/cpu: default is this host's physical memory
  std::optional<EmuProfile> emu;             // emu: the chip to emulate; default default_emu_profile()
};

// A 1.0-speed chip with 4 GiB: what `emu` emulates when no profile is given.
EmuProfile default_emu_profile();

// Throws Error(kNotFound) for an unknown backend, listing the known ones.
std::unique_ptr<Device> create_device(const DeviceSpec& spec);

size_t host_memory_bytes();
// What this host can give without swapping: /proc/meminfo's MemAvailable (host_memory_bytes() where it cannot be
// read).
size_t available_host_memory_bytes();
// This process's peak resident memory so far (getrusage's ru_maxrss): what it has taken of the host's memory at
// most, its device's included where that is host memory (an emulated or cpu chip's).
size_t peak_resident_bytes();

}  // namespace h2
