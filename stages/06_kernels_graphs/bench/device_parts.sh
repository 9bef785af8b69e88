# What every device script shares (sourced from the repository root by
# stages/06_kernels_graphs/gpu_check.sh and final/gpu_serve_check.sh):
#
#   card_name            the card's short name from nvidia-smi ("NVIDIA H100 80GB HBM3" -> h100), else "gpu"
#   part LIMIT CMD...    runs CMD under LIMIT seconds, its output into $LOG too; returns CMD's exit code

card_name() {
    local name
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' \
           | grep -oE '\b[a-z]+[0-9]+\b' | head -1)
    echo "${name:-gpu}"
}

part() {
    local limit=$1; shift
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && echo "!! stopped at its limit of $limit s: $*" | tee -a "$LOG"
    return "$rc"
}
