#include "kimirt/eval/sse_parser.h"

namespace kimirt::eval {

void SseParser::Feed(std::string_view bytes, std::vector<std::string>* events) {
  for (char c : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      skip_lf_ = c == '\r';
      ProcessLine(events);
      line_.clear();
      continue;
    }
    line_.push_back(c);
  }
}

void SseParser::Finish(std::vector<std::string>* events) {
  if (!line_.empty()) {
    ProcessLine(events);
    line_.clear();
  }
  Dispatch(events);
}

void SseParser::ProcessLine(std::vector<std::string>* events) {
  if (line_.empty()) {
    Dispatch(events);
    return;
  }
  if (line_[0] == ':') return;  // comment
  std::string_view field = line_;
  std::string_view value;
  const size_t colon = field.find(':');
  if (colon != std::string_view::npos) {
    value = field.substr(colon + 1);
    field = field.substr(0, colon);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  }
}

void SseParser::Dispatch(std::vector<std::string>* events) {
  if (!has_data_) return;
  if (!data_.empty() && data_.back() == '\n') data_.pop_back();
  events->push_back(std::move(data_));
  data_.clear();
  has_data_ = false;
}

}  // namespace kimirt::eval
