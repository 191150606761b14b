#include "kimirt/eval/openai_client.h"

#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "kimirt/eval/sse_parser.h"

namespace kimirt::eval {
namespace {

using Json = nlohmann::json;

std::string Shorten(std::string_view s, size_t n = 300) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

void SetTimeout(double seconds, const std::function<void(time_t, time_t)>& set) {
  const double s = seconds > 0 ? seconds : 0;
  const time_t whole = static_cast<time_t>(s);
  set(whole, static_cast<time_t>((s - static_cast<double>(whole)) * 1e6));
}

Usage ReadUsage(const Json& j) {
  Usage u;
  if (!j.is_object()) return u;
  if (auto it = j.find("prompt_tokens"); it != j.end() && it->is_number_integer()) u.prompt_tokens = it->get<int64_t>();
  if (auto it = j.find("completion_tokens"); it != j.end() && it->is_number_integer()) {
    u.completion_tokens = it->get<int64_t>();
  }
  return u;
}

std::string TransportError(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (is the server running and listening there?)";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "reading the response failed or timed out";
    case httplib::Error::Write: return "sending the request failed";
    default: return httplib::to_string(e);
  }
}

httplib::Headers RequestHeaders(bool stream) {
  httplib::Headers h;
  h.emplace("Accept", stream ? "text/event-stream" : "application/json");
  // Same convention as the OpenAI clients, lm-eval and vLLM's benchmark.
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr && key[0] != '\0') {
    h.emplace("Authorization", std::string("Bearer ") + key);
  }
  return h;
}

}  // namespace

std::string ErrorBodyMessage(std::string_view body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) return (*e)["message"].get<std::string>();
      if (e->is_string()) return e->get<std::string>();
    }
    if (auto m = j.find("message"); m != j.end() && m->is_string()) return m->get<std::string>();
  }
  return Shorten(body);
}

Result<Completion> ParseCompletionBody(std::string_view body, bool chat) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corrupt("the reply is not a JSON object: " + Shorten(body));
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) {
    return Corrupt("the reply has no choices: " + Shorten(body));
  }
  const Json& c = (*choices)[0];
  Completion out;
  if (chat) {
    auto m = c.find("message");
    if (m == c.end() || !m->is_object()) return Corrupt("choices[0] has no message: " + Shorten(body));
    auto content = m->find("content");
    if (content == m->end() || content->is_null()) {
      out.content_null = true;
    } else if (content->is_string()) {
      out.text = content->get<std::string>();
    } else {
      return Corrupt("choices[0].message.content is not a string: " + Shorten(body));
    }
  } else {
    auto t = c.find("text");
    if (t == c.end() || !t->is_string()) return Corrupt("choices[0].text is missing or not a string: " + Shorten(body));
    out.text = t->get<std::string>();
  }
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) out.finish_reason = f->get<std::string>();
  if (auto u = j.find("usage"); u != j.end()) out.usage = ReadUsage(*u);
  return out;
}

Status ApplyStreamEvent(std::string_view data, bool chat, double now_s, StreamedCompletion* out, bool* done) {
  ++out->events;
  if (data == "[DONE]") {
    *done = true;
    return Status::Ok();
  }
  Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corrupt("a stream event is not JSON: " + Shorten(data));
  if (auto e = j.find("error"); e != j.end()) return Internal("the server reported an error mid-stream: " + ErrorBodyMessage(data));
  const int64_t tokens_before = out->usage.completion_tokens;
  bool counted = false;  // the chunk says how many tokens exist so far (continuous usage stats)
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    out->usage = ReadUsage(*u);
    counted = out->usage.completion_tokens >= 0;
  }
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return Status::Ok();  // e.g. the usage chunk
  const Json& c = (*choices)[0];
  if (!c.is_object()) return Corrupt("a stream event's choices[0] is not an object: " + Shorten(data));
  std::string piece;
  if (chat) {
    if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
      // Reasoning models stream their thinking first; it is generated tokens all the same.
      for (const char* key : {"reasoning_content", "content"}) {
        if (auto t = d->find(key); t != d->end() && t->is_string()) piece += t->get<std::string>();
      }
    }
  } else if (auto t = c.find("text"); t != c.end() && t->is_string()) {
    piece = t->get<std::string>();
  }
  // Only chunks carrying text count as token arrivals: a server may send a role-only chunk
  // before any token exists, which would make TTFT look instant. A chunk with the usage so far
  // counts when that count rose, text or not.
  if (counted ? out->usage.completion_tokens > std::max<int64_t>(tokens_before, 0) : !piece.empty()) {
    out->token_times_s.push_back(now_s);
  }
  out->text += piece;
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) out->finish_reason = f->get<std::string>();
  return Status::Ok();
}

struct OpenAiClient::Impl {
  explicit Impl(const ServerUrl& url) : client(url.Origin()) {}
  httplib::Client client;
};

OpenAiClient::OpenAiClient(ServerUrl url, HttpOptions options)
    : url_(std::move(url)), impl_(std::make_unique<Impl>(url_)) {
  httplib::Client& c = impl_->client;
  SetTimeout(options.connect_timeout_s, [&](time_t s, time_t us) { c.set_connection_timeout(s, us); });
  SetTimeout(options.read_timeout_s, [&](time_t s, time_t us) { c.set_read_timeout(s, us); });
  SetTimeout(options.read_timeout_s, [&](time_t s, time_t us) { c.set_write_timeout(s, us); });
  c.set_keep_alive(true);
  // httplib writes headers and body separately; with Nagle's algorithm the body then waits for
  // the server's delayed ACK (40 ms on Linux), which would land in every TTFT we measure.
  c.set_tcp_nodelay(true);
}

OpenAiClient::~OpenAiClient() = default;

Result<Completion> OpenAiClient::Complete(std::string_view endpoint, const nlohmann::json& body) {
  const std::string where = "POST " + url_.ApiUrl(endpoint);
  httplib::Result r = impl_->client.Post(url_.ApiPath(endpoint), RequestHeaders(false), body.dump(), "application/json");
  if (!r) return IoError(where + ": " + TransportError(r.error()));
  if (r->status != 200) {
    return InvalidArgument(where + ": HTTP " + std::to_string(r->status) + ": " + ErrorBodyMessage(r->body));
  }
  Result<Completion> c = ParseCompletionBody(r->body, endpoint == "chat/completions");
  if (!c.ok()) return c.status().WithContext(where);
  return c;
}

Result<StreamedCompletion> OpenAiClient::Stream(std::string_view endpoint, nlohmann::json body) {
  const std::string where = "POST " + url_.ApiUrl(endpoint) + " (stream)";
  const bool chat = endpoint == "chat/completions";
  body["stream"] = true;
  body["stream_options"]["include_usage"] = true;  // keeping what the caller asked besides

  StreamedCompletion out;
  SseParser parser;
  std::vector<std::string> events;
  std::string error_body;
  Status stream_status;
  bool done = false;
  int status = 0;

  httplib::Request req;
  req.method = "POST";
  req.path = url_.ApiPath(endpoint);
  req.headers = RequestHeaders(true);
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 65536) error_body.append(data, len);
      return true;
    }
    const double now = SteadyNowSeconds();
    parser.Feed(std::string_view(data, len), &events);
    for (const std::string& e : events) {
      if (done) break;
      stream_status = ApplyStreamEvent(e, chat, now, &out, &done);
      if (!stream_status.ok()) return false;
    }
    events.clear();
    return true;
  };

  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  out.start_s = SteadyNowSeconds();
  const bool sent = impl_->client.send(req, res, err);
  out.end_s = SteadyNowSeconds();
  if (!stream_status.ok()) return stream_status.WithContext(where);
  if (!sent && status == 0) return IoError(where + ": " + TransportError(err));
  if (status != 200) {
    return InvalidArgument(where + ": HTTP " + std::to_string(status) + ": " + ErrorBodyMessage(error_body));
  }
  if (!sent) return IoError(where + ": the stream broke off: " + TransportError(err));
  if (!done) {
    // A stream that closed without [DONE]: take a final unterminated event, then insist on it.
    parser.Finish(&events);
    for (const std::string& e : events) {
      if (done) break;
      KIMIRT_RETURN_IF_ERROR(ApplyStreamEvent(e, chat, out.end_s, &out, &done).WithContext(where));
    }
    if (!done) return Corrupt(where + ": the stream ended without data: [DONE]");
  }
  return out;
}

Result<std::vector<std::string>> OpenAiClient::ListModels() {
  const std::string where = "GET " + url_.ApiUrl("models");
  httplib::Result r = impl_->client.Get(url_.ApiPath("models"), RequestHeaders(false));
  if (!r) return IoError(where + ": " + TransportError(r.error()));
  if (r->status != 200) return InvalidArgument(where + ": HTTP " + std::to_string(r->status) + ": " + ErrorBodyMessage(r->body));
  Json j = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> ids;
  if (j.is_object() && j.contains("data") && j["data"].is_array()) {
    for (const Json& m : j["data"]) {
      if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
    }
  } else {
    return Corrupt(where + ": the reply has no data array: " + Shorten(r->body));
  }
  return ids;
}

Result<std::string> OpenAiClient::GetRootText(std::string_view path) {
  const std::string where = "GET " + url_.Origin() + url_.RootPath(path);
  httplib::Result r = impl_->client.Get(url_.RootPath(path), RequestHeaders(false));
  if (!r) return IoError(where + ": " + TransportError(r.error()));
  if (r->status != 200) return NotFound(where + ": HTTP " + std::to_string(r->status));
  return r->body;
}

}  // namespace kimirt::eval
