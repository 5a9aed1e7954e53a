// parse_bounded_json and json_excerpt: nlohmann's parser (iterative) with a callback that counts
// depth and values, and an excerpt writer that never recurses.
#include "io/bounded_json.hpp"

#include <set>
#include <vector>

#include "attn/core/error.hpp"
#include "io/excerpt.hpp"

namespace attn::io_detail {

namespace {

[[noreturn]] void fail(std::string_view source, const std::string& message) {
  throw FileError(std::string(source) + ": " + message);
}

// nlohmann's messages start with "[json.exception.<kind>.<id>] "; attn's name the file instead.
std::string without_exception_tag(std::string_view message) {
  if (message.starts_with("[json.exception.")) {
    const size_t end = message.find("] ");
    if (end != std::string_view::npos) message.remove_prefix(end + 2);
  }
  return escaped(message, 300);
}

// A string value for a message, escaped and cut at `max_length` bytes.
std::string quoted(std::string_view text, size_t max_length) {
  return "\"" + escaped(text, max_length) + "\"";
}

}  // namespace

nlohmann::json parse_bounded_json(std::string_view text, std::string_view source,
                                  std::string_view what, const JsonLimits& limits) {
  const std::string subject(what);
  std::vector<std::set<std::string>> open_objects;
  uint64_t values = 0;
  const auto count_value = [&] {
    if (++values > limits.max_values) {
      fail(source, subject + " holds more than " + std::to_string(limits.max_values) +
                       " JSON values (the limit that bounds its memory)");
    }
  };
  const nlohmann::json::parser_callback_t check =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        switch (event) {
          case Event::object_start:
          case Event::array_start:
            // `depth` counts the containers already open; the callback runs before the new one
            // is allocated, so a refused level costs nothing.
            if (depth + 1 > limits.max_depth) {
              fail(source, subject + " nests arrays and objects deeper than " +
                               std::to_string(limits.max_depth) + " levels");
            }
            count_value();
            if (event == Event::object_start) open_objects.emplace_back();
            break;
          case Event::object_end:
            open_objects.pop_back();
            break;
          case Event::key:
            if (!open_objects.back().insert(parsed.get<std::string>()).second) {
              fail(source,
                   subject + " repeats the key '" + escaped(parsed.get<std::string>(), 100) + "'");
            }
            break;
          case Event::value:
            count_value();
            break;
          case Event::array_end:
            break;
        }
        return true;
      };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& error) {
    // parse_error for the syntax, out_of_range for a number beyond double's range (1e999).
    fail(source, subject + " is not valid JSON: " + without_exception_tag(error.what()));
  }
}

std::string json_kind(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::binary:
      return "binary data";
    case nlohmann::json::value_t::discarded:
      return "nothing";
    default:
      return "a number";
  }
}

std::string json_excerpt(const nlohmann::json& value, size_t max_length) {
  struct Frame {
    const nlohmann::json* container;
    nlohmann::json::const_iterator next;
  };
  std::string text;
  std::vector<Frame> stack;
  // Writes a scalar, or opens a container to be walked by the loop below.
  const auto begin = [&](const nlohmann::json& item) {
    if (item.is_object() || item.is_array()) {
      text += item.is_object() ? '{' : '[';
      stack.push_back({&item, item.begin()});
    } else if (item.is_string()) {
      text += quoted(item.get_ref<const std::string&>(), max_length);
    } else {
      text += item.dump();  // a number, boolean or null: no recursion
    }
  };
  begin(value);
  while (!stack.empty() && text.size() <= max_length) {
    Frame& frame = stack.back();
    if (frame.next == frame.container->end()) {
      text += frame.container->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (frame.next != frame.container->begin()) text += ',';
    const auto item = frame.next++;
    if (frame.container->is_object()) text += quoted(item.key(), max_length) + ":";
    begin(*item);  // may grow the stack: `frame` is not used after this
  }
  if (text.size() > max_length) {
    text.resize(max_length);
    text += "...";
  }
  return text;
}

}  // namespace attn::io_detail
