// Slurm hostlist and tasks-per-node expansion (the grammar TF's SlurmClusterResolver accepts, plus
// Slurm's several-bracket form and zero padding).
#include "core/hostlist.h"

#include <cctype>
#include <charconv>
#include <string>
#include <vector>

#include "core/strings.h"
#include "tributary/cluster.h"

namespace tributary {
namespace {

// A typo such as "n[1-1000000000]" must fail, not exhaust memory.
constexpr size_t kMaxHosts = size_t{1} << 20;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_digit(c)) return false;
  }
  return true;
}

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

// Expands the inside of one bracket group ("3-4,6,7-9") into `values`; returns why it cannot, or
// "".
std::string expand_bracket(std::string_view inner, std::vector<std::string>* values) {
  if (inner.empty()) return "empty brackets \"[]\"; put numbers or ranges inside, e.g. \"[1-4]\"";
  for (std::string_view part : internal::split(inner, ',')) {
    if (part.empty()) return "empty entry in " + in_quotes("[" + std::string(inner) + "]");
    std::vector<std::string_view> bounds = internal::split(part, '-');
    if (bounds.size() > 2 || !all_digits(bounds.front()) || !all_digits(bounds.back())) {
      return "range " + in_quotes(part) + " is not a number or a range low-high such as \"3-5\"";
    }
    unsigned long long lo = 0, hi = 0;
    auto r1 =
        std::from_chars(bounds.front().data(), bounds.front().data() + bounds.front().size(), lo);
    auto r2 =
        std::from_chars(bounds.back().data(), bounds.back().data() + bounds.back().size(), hi);
    if (r1.ec != std::errc() || r2.ec != std::errc())
      return "number in " + in_quotes(part) + " is too large";
    if (lo > hi) {
      return "range " + in_quotes(part) + " runs backwards; write it low-high, e.g. " +
             in_quotes(std::string(bounds.back()) + "-" + std::string(bounds.front()));
    }
    if (hi - lo >= kMaxHosts || values->size() + (hi - lo) >= kMaxHosts) {
      return "range " + in_quotes(part) + " expands to more than " + std::to_string(kMaxHosts) +
             " hosts";
    }
    // Slurm and TF pad to the width of the lower bound: "08-10" -> 08 09 10.
    const size_t width = bounds.front().size();
    for (unsigned long long n = lo;; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      values->push_back(std::move(digits));
      if (n == hi) break;
    }
  }
  return "";
}

// Expands one comma-free item ("o[3-4,6]", "rack[1-2]-n[01-02]", "m5"); returns why not, or "".
std::string expand_item(std::string_view item, std::vector<std::string>* hosts) {
  std::vector<std::string> partial{""};
  size_t pos = 0;
  while (pos < item.size()) {
    size_t open = item.find('[', pos);
    std::string_view literal =
        item.substr(pos, open == std::string_view::npos ? item.npos : open - pos);
    for (std::string& p : partial) p += literal;
    if (open == std::string_view::npos) break;
    size_t close = item.find(']', open);
    std::vector<std::string> values;
    std::string why = expand_bracket(item.substr(open + 1, close - open - 1), &values);
    if (!why.empty()) return why;
    if (partial.size() * values.size() + hosts->size() > kMaxHosts) {
      return in_quotes(item) + " expands to more than " + std::to_string(kMaxHosts) + " hosts";
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const std::string& p : partial) {
      for (const std::string& v : values) next.push_back(p + v);
    }
    partial = std::move(next);
    pos = close + 1;
  }
  for (std::string& p : partial) hosts->push_back(std::move(p));
  return "";
}

}  // namespace

StatusOr<std::vector<std::string>> expand_slurm_hostlist(std::string_view hostlist) {
  auto fail = [&](const std::string& why) {
    return invalid_argument("Invalid hostlist format " + in_quotes(hostlist) + ": " + why);
  };
  if (internal::trim(hostlist).empty()) {
    return fail("it is empty; expected host names such as \"n[1-2],m5\"");
  }
  // Split at the commas outside brackets, checking that brackets pair up as we go.
  std::vector<std::string_view> items;
  size_t start = 0;
  size_t open = std::string_view::npos;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (std::isspace(static_cast<unsigned char>(c))) {
      return fail("whitespace at position " + std::to_string(i) +
                  "; host names are separated by commas only");
    }
    if (c == '[') {
      if (open != std::string_view::npos) {
        return fail("\"[\" at position " + std::to_string(i) + " is inside another \"[\"");
      }
      open = i;
    } else if (c == ']') {
      if (open == std::string_view::npos) {
        return fail("\"]\" at position " + std::to_string(i) + " has no matching \"[\"");
      }
      open = std::string_view::npos;
    } else if (c == ',' && i == hostlist.size() && open != std::string_view::npos) {
      return fail("\"[\" at position " + std::to_string(open) + " is never closed");
    } else if (c == ',' && open == std::string_view::npos) {
      if (i == start) {
        return fail("empty host name at position " + std::to_string(i) +
                    " (a leading, trailing or doubled comma)");
      }
      items.push_back(hostlist.substr(start, i - start));
      start = i + 1;
    }
  }
  std::vector<std::string> hosts;
  for (std::string_view item : items) {
    if (item.front() == '[') {
      return fail(in_quotes(item) + " has no host name before \"[\"");
    }
    std::string why = expand_item(item, &hosts);
    if (!why.empty()) return fail(why);
  }
  return hosts;
}

StatusOr<std::vector<int>> expand_slurm_tasks_per_node(std::string_view tasks_per_node) {
  auto fail = [&](const std::string& why) {
    return invalid_argument("Invalid tasks-per-node list format " + in_quotes(tasks_per_node) +
                            ": " + why);
  };
  if (tasks_per_node.empty()) return fail("it is empty; expected counts such as \"3(x2),2,1\"");
  std::vector<int> out;
  for (std::string_view part : internal::split(tasks_per_node, ',')) {
    std::string_view count = part;
    std::string_view repeat = "1";
    if (size_t paren = part.find('('); paren != std::string_view::npos) {
      count = part.substr(0, paren);
      std::string_view rest = part.substr(paren);
      if (rest.size() < 4 || !rest.starts_with("(x") || !rest.ends_with(")")) {
        return fail(in_quotes(part) +
                    " is not N or N(xR), e.g. \"3(x2)\" for two nodes of 3 tasks");
      }
      repeat = rest.substr(2, rest.size() - 3);
    }
    int n = 0, r = 0;
    auto rn = std::from_chars(count.data(), count.data() + count.size(), n);
    auto rr = std::from_chars(repeat.data(), repeat.data() + repeat.size(), r);
    if (!all_digits(count) || !all_digits(repeat) || rn.ec != std::errc() || rr.ec != std::errc()) {
      return fail(in_quotes(part) +
                  " is not N or N(xR) with non-negative whole numbers, e.g. \"3(x2)\"");
    }
    if (r < 1) return fail("repeat count in " + in_quotes(part) + " must be at least 1");
    if (out.size() + static_cast<size_t>(r) > kMaxHosts) {
      return fail(in_quotes(part) + " lists more than " + std::to_string(kMaxHosts) + " nodes");
    }
    out.insert(out.end(), static_cast<size_t>(r), n);
  }
  return out;
}

namespace internal {

bool slurm_host_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && is_digit(a[ie])) ++ie;
      while (je < b.size() && is_digit(b[je])) ++je;
      // Compare the digit runs as numbers without converting (they may be long).
      std::string_view x = a.substr(i, ie - i), y = b.substr(j, je - j);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  return a < b;  // equal under the numeric order ("n01" vs "n1"): fall back to the text
}

}  // namespace internal
}  // namespace tributary
