# scratch: the GLM-5.3-Flash-shaped 4-layer depth cut at real width (synthetic q4_k weights) on one H200: TP-2 and MLA-eager gates against its eager plan, decode speed
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck disable=SC1090
source <(sed '/^SUITE=\${1:-}/,$d' scripts/gpu.sh)
cd "$ROOT" || exit 2
SUITE=glm5cut
BUDGET=${1:-90}
logs_in /tmp/memra-glm5cut
stamp name,driver_version,memory.total
cut=glm-5.3-flash-l4
ref=$(config_plan cuda/$cut-eager)
for cand in $cut-tp2 $cut-mla-eager; do
    late "gate $cand synthetic" ||
        gate "gate $cand synthetic" 60 "" "$ref" "$(config_plan cuda/$cand)" --weights synthetic --tokens 1,2,3,4,5,6,7,8 -n 16
done
late "bench $cut synthetic" ||
    bench "bench $cut synthetic" 40 "" "$(config_plan cuda/$cut)" -n 128 --reps 3 --weights synthetic
table
