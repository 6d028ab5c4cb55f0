// Resource figures read from a cubin's ELF sections, for NVRTC builds whose
// program log carries no ptxas -v report (seen with the H200 machine's NVRTC).
//
// What a cubin holds (checked against ptxas -v for sm_80, sm_90a, sm_100a):
//  - section ".nv.info": records {u8 format, u8 attribute, payload}; format 4
//    has a u16 size and that many bytes, formats 1-3 a 2-byte value.
//    EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x11) carry
//    {u32 symbol index, u32 value} for each function;
//  - section ".nv.shared.<function>": its size is the static shared memory,
//    plus the 1 KiB ptxas reserves on sm_90 and later when there is any.
// Spill figures are not in the image; they stay 0.
#include <cstring>
#include <map>

#include "core/arch.h"
#include "gpu/compile.h"
#include "gpu/cubin.h"

namespace kforge::gpu {
namespace {

constexpr uint8_t kAttrRegCount = 0x2f;
constexpr uint8_t kAttrFrameSize = 0x11;

template <typename T>
bool Read(std::string_view data, uint64_t offset, T& out) {
  if (offset > data.size() || data.size() - offset < sizeof(T)) return false;
  std::memcpy(&out, data.data() + offset, sizeof(T));
  return true;
}

struct Section {
  std::string name;
  uint32_t type = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
};

std::string CString(std::string_view data, uint64_t offset) {
  if (offset >= data.size()) return "";
  size_t end = data.find('\0', offset);
  if (end == std::string_view::npos) return "";
  return std::string(data.substr(offset, end - offset));
}

// The section headers of a 64-bit little-endian ELF image, names resolved;
// empty when `cubin` is no such image.
std::vector<Section> ReadSections(std::string_view cubin) {
  std::vector<Section> sections;
  if (cubin.size() < 64 || cubin.substr(0, 4) != "\x7f" "ELF" || cubin[4] != 2 || cubin[5] != 1) {
    return sections;
  }
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (!Read(cubin, 0x28, shoff) || !Read(cubin, 0x3a, shentsize) || !Read(cubin, 0x3c, shnum) ||
      !Read(cubin, 0x3e, shstrndx) || shentsize < 64 || shstrndx >= shnum) {
    return sections;
  }
  sections.resize(shnum);
  std::vector<uint32_t> names(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint64_t at = shoff + uint64_t{i} * shentsize;
    if (!Read(cubin, at, names[i]) || !Read(cubin, at + 4, sections[i].type) ||
        !Read(cubin, at + 0x18, sections[i].offset) || !Read(cubin, at + 0x20, sections[i].size) ||
        !Read(cubin, at + 0x28, sections[i].link)) {
      return {};
    }
    sections[i].link &= 0xffff;
  }
  const Section& shstr = sections[shstrndx];
  for (uint16_t i = 0; i < shnum; ++i) sections[i].name = CString(cubin, shstr.offset + names[i]);
  return sections;
}

}  // namespace

std::vector<GlobalSection> MutableGlobalSections(std::string_view cubin) {
  std::vector<GlobalSection> out;
  const std::vector<Section> sections = ReadSections(cubin);
  std::map<size_t, size_t> index;  // section number -> entry of `out`
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    if ((s.name == ".nv.global" || s.name.rfind(".nv.global.", 0) == 0) && s.size > 0) {
      index[i] = out.size();
      out.push_back(GlobalSection{s.name, s.size, {}});
    }
  }
  // Data symbols (OBJECT) defined in those sections, from .symtab.
  for (const Section& s : sections) {
    if (s.type != 2 || s.link >= sections.size()) continue;
    const Section& str = sections[s.link];
    for (uint64_t k = 0; k * 24 + 24 <= s.size; ++k) {
      const uint64_t at = s.offset + k * 24;
      uint32_t name = 0;
      uint8_t info = 0;
      uint16_t shndx = 0;
      uint64_t value = 0;
      if (!Read(cubin, at, name) || !Read(cubin, at + 4, info) || !Read(cubin, at + 6, shndx) ||
          !Read(cubin, at + 8, value)) {
        break;
      }
      auto it = index.find(shndx);
      if ((info & 0xf) != 1 || it == index.end()) continue;  // STT_OBJECT in a global section
      out[it->second].symbols.emplace_back(CString(cubin, str.offset + name), value);
    }
  }
  return out;
}

int64_t MutableGlobalBytes(std::string_view cubin) {
  int64_t bytes = 0;
  for (const GlobalSection& s : MutableGlobalSections(cubin)) bytes += int64_t(s.bytes);
  return bytes;
}

std::vector<FunctionResources> ParseCubinResources(std::string_view cubin, std::string_view arch) {
  std::vector<FunctionResources> out;
  std::vector<Section> sections = ReadSections(cubin);
  if (sections.empty()) return out;

  // Symbol index -> name, from .symtab (type 2) and its string table.
  std::map<uint32_t, std::string> symbols;
  for (const Section& s : sections) {
    if (s.type != 2 || s.link >= sections.size()) continue;
    const Section& str = sections[s.link];
    for (uint64_t k = 0; k * 24 + 24 <= s.size; ++k) {
      uint32_t name = 0;
      uint8_t info = 0;
      if (!Read(cubin, s.offset + k * 24, name) || !Read(cubin, s.offset + k * 24 + 4, info)) break;
      if ((info & 0xf) == 2) symbols[uint32_t(k)] = CString(cubin, str.offset + name);  // FUNC
    }
  }
  std::map<std::string, FunctionResources> by_name;
  for (const auto& [index, name] : symbols) by_name[name].function = name;
  for (const Section& s : sections) {
    if (s.name != ".nv.info") continue;
    uint64_t at = s.offset, end = s.offset + s.size;
    while (at + 4 <= end) {
      uint8_t format = 0, attr = 0;
      uint16_t size = 0;
      Read(cubin, at, format);
      Read(cubin, at + 1, attr);
      Read(cubin, at + 2, size);
      const uint64_t payload = at + 4;
      at = format == 4 ? payload + size : payload;
      if (format != 4 || size < 8 || (attr != kAttrRegCount && attr != kAttrFrameSize)) continue;
      uint32_t symbol = 0, value = 0;
      if (!Read(cubin, payload, symbol) || !Read(cubin, payload + 4, value)) break;
      auto it = symbols.find(symbol);
      if (it == symbols.end()) continue;
      FunctionResources& f = by_name[it->second];
      (attr == kAttrRegCount ? f.registers : f.stack_frame_bytes) = int(value);
    }
  }
  const std::string shared_prefix = ".nv.shared.";
  for (const Section& s : sections) {
    if (s.name.rfind(shared_prefix, 0) != 0) continue;
    auto it = by_name.find(s.name.substr(shared_prefix.size()));
    if (it == by_name.end()) continue;
    int64_t bytes = int64_t(s.size);
    const absl::StatusOr<Arch> parsed = ParseArch(arch);
    if (parsed.ok() && parsed->major >= 9 && bytes >= 1024) bytes -= 1024;
    it->second.static_smem_bytes = int(bytes);
  }
  // Entry points only: functions with their own .text section and a register count.
  for (const Section& s : sections) {
    if (s.name.rfind(".text.", 0) != 0) continue;
    auto it = by_name.find(s.name.substr(6));
    if (it != by_name.end() && it->second.registers > 0) out.push_back(it->second);
  }
  return out;
}

}  // namespace kforge::gpu
