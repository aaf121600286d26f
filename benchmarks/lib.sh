# Shell helpers of the benchmark scripts (sourced).
# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# field KEY: the value of the first KEY=number on stdin.
field() { grep -o "$1=[0-9.]*" | head -1 | cut -d= -f2; }
