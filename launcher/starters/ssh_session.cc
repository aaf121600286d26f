#include "launcher/starters/ssh_session.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ringrun/common/interfaces.h"
#include "ringrun/common/thread_annotations.h"

namespace ringrun::launcher::starters {
namespace {

bool ContainsNoCase(std::string_view haystack, std::string_view needle) {
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                        [](char a, char b) {
                          return std::tolower(static_cast<unsigned char>(a)) ==
                                 std::tolower(static_cast<unsigned char>(b));
                        });
  return it != haystack.end();
}

// ssh_options_get() strings are owned by the caller.
std::string GetOption(ssh_session s, enum ssh_options_e opt) {
  char* v = nullptr;
  if (ssh_options_get(s, opt, &v) != SSH_OK || v == nullptr) return "";
  std::string out(v);
  ssh_string_free_char(v);
  return out;
}

// "ssh-ed25519 SHA256:..." for the server's key, or "" when libssh cannot say.
std::string ServerKeyFingerprint(ssh_session s) {
  ssh_key key = nullptr;
  if (ssh_get_server_publickey(s, &key) != SSH_OK) return "";
  unsigned char* hash = nullptr;
  size_t hlen = 0;
  std::string out;
  if (ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &hlen) == SSH_OK) {
    char* fp = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, hlen);
    if (fp != nullptr) {
      const char* type = ssh_key_type_to_char(ssh_key_type(key));
      out = std::string(type ? type : "key") + " " + fp;
      ssh_string_free_char(fp);
    }
    ssh_clean_pubkey_hash(&hash);
  }
  ssh_key_free(key);
  return out;
}

std::string SockaddrToString(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], buf, sizeof(buf));
    } else {
      inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    }
  }
  return buf;
}

struct SessionDeleter {
  void operator()(ssh_session s) const {
    if (s == nullptr) return;
    if (ssh_is_connected(s)) {
      ssh_set_blocking(s, 0);  // never wait on a dead peer while tearing down
      ssh_disconnect(s);
    }
    ssh_free(s);
  }
};
using SessionPtr = std::unique_ptr<ssh_session_struct, SessionDeleter>;

class LibsshSession final : public SshSession {
 public:
  LibsshSession(SessionPtr session, std::string display, std::string local_address)
      : session_(std::move(session)),
        display_(std::move(display)),
        local_address_(std::move(local_address)) {
    ssh_callbacks_init(&callbacks_);
    callbacks_.userdata = this;
    callbacks_.channel_data_function = &LibsshSession::OnData;
    callbacks_.channel_eof_function = &LibsshSession::OnEof;
    callbacks_.channel_close_function = &LibsshSession::OnClose;
    callbacks_.channel_exit_status_function = &LibsshSession::OnExitStatus;
    callbacks_.channel_exit_signal_function = &LibsshSession::OnExitSignal;
  }

  ~LibsshSession() override {
    if (event_ != nullptr) {
      ssh_event_remove_session(event_, session_.get());
      ssh_event_free(event_);
    }
    if (channel_ != nullptr) {
      ssh_set_blocking(session_.get(), 0);
      ssh_remove_channel_callbacks(channel_, &callbacks_);
      if (!ssh_channel_is_closed(channel_)) ssh_channel_close(channel_);
      ssh_channel_free(channel_);
    }
    // session_ disconnects and frees.
  }

  std::string LocalAddress() const override { return local_address_; }

  Status Exec(const std::string& command) override {
    if (channel_ != nullptr) return Internal(display_ + ": one command per SSH session");
    ssh_session s = session_.get();
    channel_ = ssh_channel_new(s);
    if (channel_ == nullptr) return Internal(display_ + ": ssh_channel_new: " + ssh_get_error(s));
    if (ssh_channel_open_session(channel_) != SSH_OK) {
      return Unavailable(display_ + ": cannot open an SSH session channel: " + ssh_get_error(s));
    }
    ssh_set_channel_callbacks(channel_, &callbacks_);
    if (ssh_channel_request_exec(channel_, command.c_str()) != SSH_OK) {
      return Unavailable(display_ +
                         ": the SSH server refused to run the agent command: " + ssh_get_error(s));
    }
    return Status::Ok();
  }

  Status WriteStdin(std::string_view data) override {
    if (channel_ == nullptr) return Internal(display_ + ": WriteStdin before Exec");
    while (!data.empty()) {
      int n = ssh_channel_write(channel_, data.data(), static_cast<uint32_t>(data.size()));
      if (n == SSH_ERROR) {
        // The callbacks ran inside the write: the remote side may have exited and closed.
        if (remote_closed_ || exit_status_.has_value()) return Status::Ok();
        return Unavailable(display_ +
                           ": writing to the agent's stdin: " + ssh_get_error(session_.get()));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::Ok();
  }

  void Pump(int timeout_ms, int wake_fd, ExecEvents* events) override {
    ssh_session s = session_.get();
    if (channel_ != nullptr && !closed_ && ssh_is_connected(s)) {
      if (event_ == nullptr) {
        event_ = ssh_event_new();
        if (event_ != nullptr) ssh_event_add_session(event_, s);
      }
      if (event_ != nullptr && wake_fd >= 0 && wake_fd != wake_fd_added_) {
        ssh_event_add_fd(event_, wake_fd, POLLIN, &LibsshSession::OnWake, nullptr);
        wake_fd_added_ = wake_fd;
      }
      bool have_pending = !out_.empty() || !err_.empty() || exit_status_.has_value();
      int rc =
          event_ != nullptr ? ssh_event_dopoll(event_, have_pending ? 0 : timeout_ms) : SSH_ERROR;
      if (rc == SSH_ERROR && !closed_) {
        error_ = Unavailable(display_ + ": SSH connection lost: " + ssh_get_error(s));
        closed_ = true;
      }
    }
    if (!closed_ && (channel_ == nullptr || !ssh_is_connected(s) ||
                     (ssh_get_status(s) & (SSH_CLOSED | SSH_CLOSED_ERROR)) != 0)) {
      if (!remote_closed_) {
        error_ = Unavailable(display_ + ": SSH connection lost: " + ssh_get_error(s));
      }
      closed_ = true;
    }
    events->stdout_data += std::exchange(out_, {});
    events->stderr_data += std::exchange(err_, {});
    if (exit_status_ && !exit_reported_) {
      events->exit_status = exit_status_;
      exit_reported_ = true;
    }
    if (closed_ || remote_closed_) {
      events->closed = true;
      if (!error_.ok()) events->error = error_;
    }
  }

  int PollFd() const override {
    if (closed_ || remote_closed_ || !ssh_is_connected(session_.get())) return -1;
    return static_cast<int>(ssh_get_fd(session_.get()));
  }

  void Terminate() override {
    if (channel_ == nullptr || terminated_) return;
    terminated_ = true;
    ssh_session s = session_.get();
    ssh_set_blocking(s, 0);
    if (!ssh_channel_is_closed(channel_)) {
      ssh_channel_request_send_signal(channel_, "TERM");
      ssh_channel_send_eof(channel_);
      ssh_channel_close(channel_);
    }
    closed_ = true;
  }

 private:
  static int OnData(ssh_session, ssh_channel, void* data, uint32_t len, int is_stderr,
                    void* userdata) {
    auto* self = static_cast<LibsshSession*>(userdata);
    (is_stderr ? self->err_ : self->out_).append(static_cast<const char*>(data), len);
    return static_cast<int>(len);
  }
  static void OnEof(ssh_session, ssh_channel, void*) {}
  static void OnClose(ssh_session, ssh_channel, void* userdata) {
    static_cast<LibsshSession*>(userdata)->remote_closed_ = true;
  }
  static void OnExitStatus(ssh_session, ssh_channel, int status, void* userdata) {
    static_cast<LibsshSession*>(userdata)->exit_status_ = status;
  }
  static void OnExitSignal(ssh_session, ssh_channel, const char* signal, int, const char*,
                           const char*, void* userdata) {
    static_cast<LibsshSession*>(userdata)->exit_status_ = 128 + SignalNumber(signal);
  }
  static int OnWake(socket_t, int, void*) { return 0; }

  static int SignalNumber(const char* name) {
    static const std::pair<const char*, int> kSignals[] = {
        {"HUP", 1},   {"INT", 2},   {"QUIT", 3},  {"ILL", 4},   {"ABRT", 6},
        {"FPE", 8},   {"KILL", 9},  {"USR1", 10}, {"SEGV", 11}, {"USR2", 12},
        {"PIPE", 13}, {"ALRM", 14}, {"TERM", 15}};
    for (const auto& [n, v] : kSignals) {
      if (name != nullptr && std::string_view(name) == n) return v;
    }
    return 0;
  }

  // Constant after construction.
  SessionPtr session_;
  const std::string display_;
  const std::string local_address_;
  ssh_channel_callbacks_struct callbacks_{};
  // Used only by the one thread that drives the session (see the class contract); the libssh
  // callbacks run inside Pump/WriteStdin on that same thread.
  ssh_channel channel_ = nullptr;
  ssh_event event_ = nullptr;
  int wake_fd_added_ = -1;
  std::string out_, err_;
  std::optional<int> exit_status_;
  bool exit_reported_ = false;
  bool remote_closed_ = false;
  bool closed_ = false;
  bool terminated_ = false;
  Status error_;
};

class LibsshConnector final : public SshConnector {
 public:
  SshConnectOutcome Connect(const hosts::HostSpec& host, const SshConfig& config) override {
    SshConnectOutcome out;
    const std::string display = host.Display();
    auto fail = [&](SshFailure kind, std::string what) {
      out.failure = kind;
      out.status = Status(SshFailureCode(kind), display + ": " + what);
      return std::move(out);
    };

    SessionPtr session(ssh_new());
    if (!session) return fail(SshFailure::kOther, "ssh_new failed");
    ssh_session s = session.get();
    // Order matters: the host first (config sections match on it), then ~/.ssh/config, then
    // what the command line says, which wins.
    if (ssh_options_set(s, SSH_OPTIONS_HOST, host.name.c_str()) != SSH_OK) {
      return fail(SshFailure::kOther, std::string("bad host name: ") + ssh_get_error(s));
    }
    if (ssh_options_parse_config(s, nullptr) != SSH_OK) {
      return fail(SshFailure::kOther, std::string("reading ssh config: ") + ssh_get_error(s));
    }
    if (!host.user.empty()) ssh_options_set(s, SSH_OPTIONS_USER, host.user.c_str());
    if (config.port > 0) {
      unsigned int port = static_cast<unsigned int>(config.port);
      ssh_options_set(s, SSH_OPTIONS_PORT, &port);
    }
    if (!config.known_hosts.empty()) {
      ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, config.known_hosts.c_str());
    }
    long timeout_s = std::max(1, config.connect_timeout_s);
    ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &timeout_s);
    int no = 0;
    ssh_options_set(s, SSH_OPTIONS_PROCESS_CONFIG, &no);  // already parsed above

    if (ssh_connect(s) != SSH_OK) {
      std::string text = ssh_get_error(s);
      SshFailure kind = ClassifyConnectError(text);
      unsigned int port = 0;
      ssh_options_get_port(s, &port);
      return fail(kind, std::string(SshFailureName(kind)) + " connecting to " +
                            GetOption(s, SSH_OPTIONS_HOST) + " port " + std::to_string(port) +
                            " [libssh: " + text + "]");
    }

    Status key_status = VerifyHostKey(s, config, &out.failure);
    if (!key_status.ok()) {
      out.status = key_status.Annotate(display);
      return out;
    }

    Status auth = Authenticate(s, config);
    if (!auth.ok()) {
      out.failure = SshFailure::kAuthDenied;
      out.status = auth.Annotate(display);
      return out;
    }

    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    std::string local_address;
    if (getsockname(ssh_get_fd(s), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      local_address = SockaddrToString(local);
    }
    out.session = std::make_unique<LibsshSession>(std::move(session), display, local_address);
    return out;
  }

 private:
  Status VerifyHostKey(ssh_session s, const SshConfig& config, SshFailure* failure) {
    std::string file = GetOption(s, SSH_OPTIONS_KNOWNHOSTS);
    if (file.empty()) file = config.known_hosts.empty() ? "~/.ssh/known_hosts" : config.known_hosts;
    std::string fingerprint = ServerKeyFingerprint(s);
    enum ssh_known_hosts_e state;
    {
      MutexLock lock(&known_hosts_mu_);
      state = ssh_session_is_known_server(s);
      if ((state == SSH_KNOWN_HOSTS_UNKNOWN || state == SSH_KNOWN_HOSTS_NOT_FOUND) &&
          config.accept_new_host_keys) {
        if (ssh_session_update_known_hosts(s) != SSH_OK) {
          *failure = SshFailure::kOther;
          return Internal("cannot add the host key (" + fingerprint + ") to " + file + ": " +
                          ssh_get_error(s));
        }
        return Status::Ok();
      }
    }
    switch (state) {
      case SSH_KNOWN_HOSTS_OK:
        return Status::Ok();
      case SSH_KNOWN_HOSTS_CHANGED:
      case SSH_KNOWN_HOSTS_OTHER:
        *failure = SshFailure::kHostKeyChanged;
        return PermissionDenied(
            "host key changed: the server offered " + fingerprint + ", which does not match " +
            file + " (this could be a man-in-the-middle attack); refusing to connect, and " + file +
            " is left untouched");
      case SSH_KNOWN_HOSTS_UNKNOWN:
      case SSH_KNOWN_HOSTS_NOT_FOUND:
        *failure = SshFailure::kHostKeyUnknown;
        return PermissionDenied("host key unknown: " + fingerprint + " is not in " + file +
                                "; add it there (ssh-keyscan), or pass --ssh-accept-new-host-keys "
                                "to append it");
      case SSH_KNOWN_HOSTS_ERROR:
      default:
        *failure = SshFailure::kOther;
        return Internal("checking the host key against " + file + ": " + ssh_get_error(s));
    }
  }

  static Status Authenticate(ssh_session s, const SshConfig& config) {
    std::string user = GetOption(s, SSH_OPTIONS_USER);
    int rc;
    std::string how;
    if (!config.identity_file.empty()) {
      ssh_key key = nullptr;
      if (ssh_pki_import_privkey_file(config.identity_file.c_str(), nullptr, nullptr, nullptr,
                                      &key) != SSH_OK) {
        return PermissionDenied("authentication denied: cannot read the private key " +
                                config.identity_file);
      }
      rc = ssh_userauth_publickey(s, nullptr, key);
      ssh_key_free(key);
      how = "the key " + config.identity_file;
    } else {
      rc = ssh_userauth_publickey_auto(s, nullptr, nullptr);
      how = "ssh-agent and the default keys";
    }
    if (rc == SSH_AUTH_SUCCESS) return Status::Ok();
    return PermissionDenied("authentication denied for user " + user + " with " + how +
                            " [libssh: " + ssh_get_error(s) + "]");
  }

  // Serialises reading and appending known_hosts files (libssh's, outside this object).
  Mutex known_hosts_mu_;
};

}  // namespace

const char* SshFailureName(SshFailure failure) {
  switch (failure) {
    case SshFailure::kNone:
      return "ok";
    case SshFailure::kResolution:
      return "name resolution failed";
    case SshFailure::kRefused:
      return "connection refused";
    case SshFailure::kTimeout:
      return "connection timed out";
    case SshFailure::kUnreachable:
      return "host unreachable";
    case SshFailure::kTransient:
      return "connection dropped";
    case SshFailure::kAuthDenied:
      return "authentication denied";
    case SshFailure::kHostKeyUnknown:
      return "host key unknown";
    case SshFailure::kHostKeyChanged:
      return "host key changed";
    case SshFailure::kOther:
      return "SSH error";
  }
  return "SSH error";
}

Code SshFailureCode(SshFailure failure) {
  switch (failure) {
    case SshFailure::kNone:
      return Code::kOk;
    case SshFailure::kResolution:
      return Code::kNotFound;
    case SshFailure::kTimeout:
      return Code::kTimeout;
    case SshFailure::kRefused:
    case SshFailure::kUnreachable:
    case SshFailure::kTransient:
      return Code::kUnavailable;
    case SshFailure::kAuthDenied:
    case SshFailure::kHostKeyUnknown:
    case SshFailure::kHostKeyChanged:
      return Code::kPermissionDenied;
    case SshFailure::kOther:
      return Code::kInternal;
  }
  return Code::kInternal;
}

SshFailure ClassifyConnectError(std::string_view t) {
  if (ContainsNoCase(t, "resolve") || ContainsNoCase(t, "not known") ||
      ContainsNoCase(t, "no address associated")) {
    return SshFailure::kResolution;
  }
  if (ContainsNoCase(t, "refused")) return SshFailure::kRefused;
  if (ContainsNoCase(t, "timeout") || ContainsNoCase(t, "timed out")) return SshFailure::kTimeout;
  if (ContainsNoCase(t, "no route") || ContainsNoCase(t, "unreachable")) {
    return SshFailure::kUnreachable;
  }
  if (ContainsNoCase(t, "reset by peer") || ContainsNoCase(t, "disconnected") ||
      ContainsNoCase(t, "connection closed") || ContainsNoCase(t, "broken pipe") ||
      ContainsNoCase(t, "temporarily unavailable") || ContainsNoCase(t, "banner")) {
    return SshFailure::kTransient;
  }
  return SshFailure::kOther;
}

std::unique_ptr<SshConnector> MakeLibsshConnector() { return std::make_unique<LibsshConnector>(); }

Result<std::string> InterfaceAddress(const std::vector<std::string>& names) {
  Result<std::vector<NetInterface>> list = ListInterfaces();
  if (!list.ok()) return list.status();
  return FirstInterfaceAddress(*list, names);
}

}  // namespace ringrun::launcher::starters
