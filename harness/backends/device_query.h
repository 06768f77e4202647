// What the GPUs of this machine are, asked of the CUDA runtime in a CUDA build ("none" without
// CUDA). Only `mlafuzz worker` calls these, so the campaign process itself never creates a CUDA
// context: device faults stay in the workers.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mlafuzz {

struct DeviceInfo {
  int count = 0;
  std::vector<std::string> names;  // per device (cudaGetDeviceProperties)
  std::string driver = "none";     // cudaDriverGetVersion, "13.0"
  std::string runtime = "none";    // cudaRuntimeGetVersion
  std::string error;               // why the query failed, if it did
};

DeviceInfo query_devices();

// After a failed run on a device: the sticky error the CUDA context now carries (an illegal
// address or a trap poisons the context for good), or nullopt if the context is healthy.
std::optional<std::string> sticky_device_error();

// JSON text of a DeviceInfo (what `mlafuzz worker --device-info` prints) and back.
std::string device_info_to_json(const DeviceInfo& d);
DeviceInfo device_info_from_json(const std::string& text);

}  // namespace mlafuzz
