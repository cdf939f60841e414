#include "storage/s3/http_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt::s3 {
namespace {

// Far more headers than any S3 answer has; a bound against a hostile one.
constexpr size_t kMaxResponseHeaders = 128;

// curl_global_init is not thread-safe and must run once per process
// before any other curl call; a function-local static runs it exactly once.
CURLcode GlobalInit() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  return code;
}

// One request's state, shared with the callbacks.
struct Transfer {
  CURL* handle = nullptr;
  absl::string_view whole;  // the request body
  absl::string_view body;   // left to send: a suffix of `whole`
  absl::Span<char> into;
  bool into_decided = false;
  bool use_into = false;
  size_t cap = 0;
  HttpResponse* response = nullptr;
  std::string write_error;  // why the write callback refused bytes
};

size_t ReadBody(char* buffer, size_t size, size_t count, void* data) {
  auto* transfer = static_cast<Transfer*>(data);
  const size_t n = std::min(size * count, transfer->body.size());
  std::memcpy(buffer, transfer->body.data(), n);
  transfer->body.remove_prefix(n);
  return n;
}

// libcurl rewinds the body when it must send it again on a new connection
// (a reused connection that dropped mid-send, a redirect). Without this it
// cannot, and the transfer fails with CURLE_SEND_FAIL_REWIND, which is not
// a transient error by its code: a connection closed in the middle of a
// PutObject failed the whole upload at once instead of being retried
// (found by the connections-closed-mid-transfer case of
// tests/integration/remote_faults_test.cc). The body is the caller's
// memory, so any offset in it can be sent again.
int SeekBody(void* data, curl_off_t offset, int origin) {
  auto* transfer = static_cast<Transfer*>(data);
  if (origin != SEEK_SET || offset < 0 ||
      static_cast<uint64_t>(offset) > transfer->whole.size()) {
    return CURL_SEEKFUNC_FAIL;
  }
  transfer->body = transfer->whole.substr(static_cast<size_t>(offset));
  return CURL_SEEKFUNC_OK;
}

size_t WriteBody(char* bytes, size_t size, size_t count, void* data) {
  auto* transfer = static_cast<Transfer*>(data);
  const size_t n = size * count;
  HttpResponse& response = *transfer->response;
  if (!transfer->into_decided) {
    // Only a success goes into the caller's memory; an error's XML body
    // must not overwrite it.
    long status = 0;
    if (curl_easy_getinfo(transfer->handle, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK) {
      transfer->write_error = "curl_easy_getinfo(CURLINFO_RESPONSE_CODE) failed";
      return 0;
    }
    transfer->use_into = !transfer->into.empty() && status >= 200 && status < 300;
    transfer->into_decided = true;
  }
  if (transfer->use_into) {
    if (response.bytes_into + n > transfer->into.size()) {
      transfer->write_error = absl::StrCat("the response body is larger than the ",
                                           transfer->into.size(), "-byte buffer given for it");
      return 0;
    }
    std::memcpy(transfer->into.data() + response.bytes_into, bytes, n);
    response.bytes_into += n;
    return n;
  }
  if (response.body.size() + n > transfer->cap) {
    transfer->write_error =
        absl::StrCat("the response body is larger than the ", transfer->cap, "-byte cap");
    return 0;
  }
  response.body.append(bytes, n);
  return n;
}

size_t OnHeader(char* line_bytes, size_t size, size_t count, void* data) {
  auto* transfer = static_cast<Transfer*>(data);
  const size_t n = size * count;
  absl::string_view line(line_bytes, n);
  auto& headers = transfer->response->headers;
  if (absl::StartsWith(line, "HTTP/")) {
    headers.clear();  // a new response (after a 100 Continue, say)
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;  // the blank line at the end
  if (headers.size() >= kMaxResponseHeaders) {
    transfer->write_error = absl::StrCat("more than ", kMaxResponseHeaders, " response headers");
    return 0;
  }
  std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  for (auto& [known, known_value] : headers) {
    if (known == name) {
      known_value = std::move(value);
      return n;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
  return n;
}

template <typename T>
absl::Status SetOpt(CURL* handle, CURLoption option, T value, const char* name) {
  const CURLcode code = curl_easy_setopt(handle, option, value);
  if (code != CURLE_OK) {
    return absl::InternalError(
        absl::StrCat("curl_easy_setopt(", name, "): ", curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}
#define CKPT_SETOPT(handle, option, value) SetOpt(handle, option, value, #option)

// A failed curl_easy_perform as a Status whose code says whether to retry.
absl::Status TransferError(CURLcode code, const char* detail, const Transfer& transfer) {
  std::string message = curl_easy_strerror(code);
  if (!transfer.write_error.empty()) {
    message = transfer.write_error;
  } else if (detail[0] != '\0') {
    absl::StrAppend(&message, " (", detail, ")");
  }
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return absl::DeadlineExceededError(message);
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    // The connection dropped while the body was sent and libcurl could not
    // send it again on that attempt: the next attempt sends it whole.
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return absl::UnavailableError(message);
    case CURLE_WRITE_ERROR:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::string_view HttpResponse::Header(absl::string_view lower_case_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) return value;
  }
  return {};
}

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Create(
    HttpTransportOptions options) {
  if (const CURLcode code = GlobalInit(); code != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_global_init: ", curl_easy_strerror(code)));
  }
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(options)));
}

HttpTransport::~HttpTransport() {
  absl::MutexLock lock(&mutex_);
  for (void* handle : idle_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* HttpTransport::AcquireHandle() {
  {
    absl::MutexLock lock(&mutex_);
    if (!idle_.empty()) {
      void* handle = idle_.back();
      idle_.pop_back();
      return handle;
    }
  }
  return curl_easy_init();
}

void HttpTransport::ReleaseHandle(void* handle) {
  CURL* curl = static_cast<CURL*>(handle);
  // Clears the options but keeps the handle's live connection for reuse.
  curl_easy_reset(curl);
  absl::MutexLock lock(&mutex_);
  if (idle_.size() < options_.max_idle_handles) {
    idle_.push_back(curl);
    return;
  }
  curl_easy_cleanup(curl);
}

absl::StatusOr<HttpResponse> HttpTransport::Perform(const HttpRequest& request) {
  CURL* handle = static_cast<CURL*>(AcquireHandle());
  if (handle == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  struct HandleReturn {
    HttpTransport* transport;
    CURL* handle;
    curl_slist* headers = nullptr;
    ~HandleReturn() {
      curl_slist_free_all(headers);
      transport->ReleaseHandle(handle);
    }
  } handle_return{this, handle};

  HttpResponse response;
  Transfer transfer;
  transfer.handle = handle;
  transfer.whole = request.body;
  transfer.body = request.body;
  transfer.into = request.body_into;
  transfer.cap = options_.max_response_bytes;
  transfer.response = &response;

  // "Expect:" turns off curl's 100-continue wait before a body over 1 MiB
  // (a round trip per part for nothing: a rejected part is retried whole).
  std::vector<std::string> lines;
  for (const auto& [name, value] : request.headers) {
    lines.push_back(absl::StrCat(name, ": ", value));
  }
  lines.push_back("Expect:");
  for (const std::string& line : lines) {
    curl_slist* grown = curl_slist_append(handle_return.headers, line.c_str());
    if (grown == nullptr) return absl::ResourceExhaustedError("curl_slist_append failed");
    handle_return.headers = grown;
  }

  const long timeout_ms = static_cast<long>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(request.timeout)));
  const long connect_ms = static_cast<long>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.connect_timeout)));
  const long low_speed_s = static_cast<long>(
      std::max<int64_t>(1, absl::ToInt64Seconds(options_.low_speed_time)));
  char error_detail[CURL_ERROR_SIZE] = "";
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_URL, request.url.c_str()));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_PROTOCOLS_STR, "http,https"));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_NOSIGNAL, 1L));  // threads: no SIGALRM
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_ERRORBUFFER, error_detail));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_HTTPHEADER, handle_return.headers));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_TIMEOUT_MS, timeout_ms));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_CONNECTTIMEOUT_MS, connect_ms));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_LOW_SPEED_LIMIT,
                              static_cast<long>(options_.low_speed_bytes_per_second)));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_LOW_SPEED_TIME, low_speed_s));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_BUFFERSIZE, options_.receive_buffer_bytes));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_WRITEFUNCTION, WriteBody));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_WRITEDATA, &transfer));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_HEADERFUNCTION, OnHeader));
  RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_HEADERDATA, &transfer));
  if (!options_.ca_file.empty()) {
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_CAINFO, options_.ca_file.c_str()));
  }
  if (request.method == "GET") {
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_HTTPGET, 1L));
  } else if (request.method == "HEAD") {
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_NOBODY, 1L));
  } else if (request.method == "PUT" || request.method == "POST") {
    // An upload streams the body from the caller's memory with a
    // Content-Length; a POST is the same transfer under another verb.
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_UPLOAD, 1L));
    RETURN_IF_ERROR(
        CKPT_SETOPT(handle, CURLOPT_UPLOAD_BUFFERSIZE, options_.send_buffer_bytes));
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_READFUNCTION, ReadBody));
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_READDATA, &transfer));
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_SEEKFUNCTION, SeekBody));
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_SEEKDATA, &transfer));
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_INFILESIZE_LARGE,
                                static_cast<curl_off_t>(request.body.size())));
    if (request.method == "POST") {
      RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_CUSTOMREQUEST, "POST"));
    }
  } else {
    RETURN_IF_ERROR(CKPT_SETOPT(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str()));
  }

  const CURLcode code = curl_easy_perform(handle);
  if (code != CURLE_OK) {
    return Annotate(TransferError(code, error_detail, transfer),
                    absl::StrCat("HTTP ", request.method, " ", request.url));
  }
  long status = 0;
  if (const CURLcode info = curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
      info != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_easy_getinfo(CURLINFO_RESPONSE_CODE): ",
                                            curl_easy_strerror(info)));
  }
  response.status = static_cast<int>(status);
  return response;
}

}  // namespace ckpt::s3
