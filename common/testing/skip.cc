#include "common/testing/skip.h"

#include <cstdlib>
#include <iostream>

#include "catch2/catch.hpp"

namespace pstrain::testing {
namespace {

std::vector<SkippedCase>& Skipped() {
  static auto* skipped = new std::vector<SkippedCase>;
  return *skipped;
}

// An XML attribute's value as written by Catch2's XmlWriter, decoded.
std::string DecodeAttribute(const std::string& value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '&') {
      out += value[i];
      continue;
    }
    const size_t end = value.find(';', i);
    if (end == std::string::npos) {
      out += value.substr(i);
      break;
    }
    const std::string entity = value.substr(i + 1, end - i - 1);
    if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "amp") {
      out += '&';
    } else if (entity == "quot") {
      out += '"';
    } else if (entity == "apos") {
      out += '\'';
    } else {
      out += value.substr(i, end - i + 1);  // kept as written
    }
    i = end;
  }
  return out;
}

std::string EncodeAttribute(const std::string& value) {
  std::string out;
  for (char c : value) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\n': out += ' '; break;
      default: out += c;
    }
  }
  return out;
}

// The value of attribute `name` inside the start tag `tag` ("" if none).
std::string Attribute(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = tag.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  const size_t end = tag.find('"', start);
  if (end == std::string::npos) return "";
  return DecodeAttribute(tag.substr(start, end - start));
}

// Whether `name` (a <testcase>'s) is `test_case` or one of its sections.
bool IsCaseOrSection(const std::string& name, const std::string& test_case) {
  return name == test_case ||
         (name.size() > test_case.size() && name.compare(0, test_case.size(), test_case) == 0 &&
          name[test_case.size()] == '/');
}

}  // namespace

bool Required(std::string_view need) {
  const char* env = std::getenv("PSTRAIN_REQUIRE");
  if (env == nullptr) return false;
  const std::string_view list(env);
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view item = list.substr(start, end - start);
    if (item == "all" || item == need) return true;
    start = end + 1;
  }
  return false;
}

void SkipCase(std::string_view need, const std::string& why) {
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  if (Required(need)) {
    FAIL("cannot run here, and PSTRAIN_REQUIRE requires " << need << ": " << why);
  }
  std::cerr << "SKIPPED: " << name << " (" << need << "): " << why << "\n";
  // Also a message in Catch2's report, which gives the case a <testcase>
  // element even when it asserted nothing.
  WARN("skipped (" << need << "): " << why);
  Skipped().push_back({name, std::string(need), why});
}

const std::vector<SkippedCase>& SkippedCases() { return Skipped(); }

std::string MarkSkippedInJunit(const std::string& xml, const std::vector<SkippedCase>& skipped) {
  if (skipped.empty()) return xml;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = xml.find("<testcase ", pos);
    if (open == std::string::npos) break;
    const size_t close = xml.find('>', open);
    if (close == std::string::npos) break;
    const std::string tag = xml.substr(open, close - open + 1);
    out += xml.substr(pos, open - pos);
    pos = close + 1;
    const std::string name = Attribute(tag, "name");
    const SkippedCase* hit = nullptr;
    for (const SkippedCase& s : skipped) {
      if (IsCaseOrSection(name, s.test_case)) hit = &s;
    }
    if (hit == nullptr) {
      out += tag;
      continue;
    }
    const std::string mark =
        "<skipped message=\"" + EncodeAttribute(hit->need + ": " + hit->why) + "\"/>";
    if (tag.size() >= 2 && tag[tag.size() - 2] == '/') {  // <testcase .../>
      out += tag.substr(0, tag.size() - 2) + ">" + mark + "</testcase>";
    } else {
      out += tag + mark;
    }
  }
  out += xml.substr(pos);
  return out;
}

}  // namespace pstrain::testing
