# Reads lines in the peer programs' format (NAME key=value ...) and prints, per size (bytes=) and
# program (NAME), the median over the lines of FIELD (default time_us) and of busbw_GBps.
#   awk -f median_table.awk [-v field=mean_us] RAW
{
  name = $1; bytes = ""; t = ""; b = ""
  for (i = 2; i <= NF; i++) {
    split($i, kv, "=")
    if (kv[1] == "bytes") bytes = kv[2]
    if (kv[1] == (field == "" ? "time_us" : field)) t = kv[2]
    if (kv[1] == "busbw_GBps") b = kv[2]
  }
  if (bytes == "" || t == "") next
  key = name SUBSEP bytes
  n[key]++; T[key, n[key]] = t; B[key, n[key]] = b
  if (!(name in seen)) { seen[name] = 1; names[++nn] = name }
  if (!(bytes in seenb)) { seenb[bytes] = 1; sizes[++ns] = bytes }
}
function median(arr, key, m,   i, j, v, tmp) {
  for (i = 1; i <= m; i++) v[i] = arr[key, i] + 0
  for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { tmp = v[i]; v[i] = v[j]; v[j] = tmp }
  return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}
END {
  printf "%-10s", "bytes"; for (j = 1; j <= nn; j++) printf " %19s", names[j]; printf "\n"
  for (i = 1; i <= ns; i++) {
    printf "%-10s", sizes[i]
    for (j = 1; j <= nn; j++) {
      key = names[j] SUBSEP sizes[i]
      if (n[key]) printf " %10.1f/%8.3f", median(T, key, n[key]), median(B, key, n[key])
      else printf " %19s", "-"
    }
    printf "\n"
  }
}
