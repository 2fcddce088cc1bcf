# Sourced by the H100 wave scripts (sh bench/h100_*.sh SECTION): the device's Python path, the section's
# output folder $W under $OUT, and three helpers (t: time a command; log: a header line; stop_ray).
# PYTHONPATH: the wheels under /root/site, then the repository (its root is the current folder).
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; W=$OUT/$1; mkdir -p "$W"
t() { s=$(date +%s); "$@"; rc=$?; echo "wall $(( $(date +%s) - s )) s (exit $rc)"; }
log() { echo "== $*"; }
stop_ray() { python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true; }
