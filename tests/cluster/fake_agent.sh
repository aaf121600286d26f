#!/bin/bash
# Stands in for ringrun-agent in the SSH-layer cluster tests: reports where it runs, what it was
# given, and whether the secret it read from stdin shows in any command line; then waits for
# stdin to close (the launcher's death, for a real agent) and exits FAKE_AGENT_EXIT or 0.
IFS= read -r secret
printf 'hostname=%s\n' "$(hostname)" >&2
i=0
for a in "$@"; do printf 'arg%d=%s\n' "$i" "$a" >&2; i=$((i + 1)); done
printf 'secret_len=%d\n' "${#secret}" >&2
found=no
grep -qsaF -f - /proc/[0-9]*/cmdline <<<"$secret" && found=yes
printf 'secret_in_cmdline=%s\n' "$found" >&2
printf 'stdout works\n'
echo "ready" >&2
cat >/dev/null  # until stdin's EOF
echo "stdin closed" >&2
exit 7
