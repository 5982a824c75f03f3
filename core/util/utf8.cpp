#include "util/utf8.hpp"

namespace zero {

bool is_valid_utf8(const std::string& s) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char* end = p + s.size();
  while (p < end) {
    const unsigned c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n = 0;
    unsigned min = 0, cp = 0;
    if ((c & 0xe0) == 0xc0)
      n = 1, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
      n = 2, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
      n = 3, cp = c & 0x07, min = 0x10000;
    else
      return false;
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    p += n + 1;
  }
  return true;
}

}  // namespace zero
