#!/usr/bin/env bash
# Where pallas_flex's default backward spends its time, on one Hopper GPU.
# kernels: backward_kernels.py times dQ alone, dK/dV alone and the whole
# backward (the harness's timing) on the seed blog's full, causal,
# causal_document and sliding_window_causal at 16k and 32k. ncu: Nsight
# Compute's full set on dQ and dK/dV at 32k on causal and causal_document
# (--clock-control none: the clocks are left as they are), each report
# exported as its raw CSV; ncu_table.py prints the counters that say what a
# kernel waits on. On a machine whose runtime gives ncu no counters (gVisor)
# the ncu part fails and the kernels part stands alone. Each run writes
# OUT/<name>/ and its .log, packed into OUT/rows.tgz after each.
#
#   experiments/lab/backward_profile.sh OUT COMMIT
#
# Written before any run: dQ runs its 3 matmuls at 640-690 TFLOP/s and
# dK/dV its 4 at 540-570 on full and causal at 32k (v6b's 681 / 563 on an
# H100), lower on causal_document (partial tiles); the whole backward less
# the two kernels (delta's rowsum, lse in base 2) costs 2-4 % of it. Under
# ncu, dK/dV's tensor pipe is active 65-72 % of its cycles against dQ's
# 80-88 %; its warps wait mostly on the wgmma results and the warpgroup
# barriers, with its 164-192 bytes a thread of spills showing as local
# memory traffic (long-scoreboard stalls) of a few per cent.
usage="usage: $0 OUT COMMIT"
source experiments/lab/pack.sh
lab_start "${1:-}" "${2:-}" profile
command -v ncu >/dev/null || PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | tail -1)
mkdir -p "$out/kernels"
run_packed "$out" kernels python3 experiments/lab/backward_kernels.py \
  --out="$out/kernels/kernels.jsonl"
for mask in causal causal_document; do
  name=ncu-$mask
  mkdir -p "$out/$name"
  run_packed "$out" "$name" ncu --clock-control none --set full \
    --kernel-name regex:'lcab_flex_(dq|dkv)_mosaic' --launch-count 2 -o "$out/$name/report" \
    python3 experiments/lab/backward_kernels.py --ncu_once --kernels=dq,dkv \
    --masks="$mask" --seqlens=32k
  ncu --import "$out/$name/report.ncu-rep" --page raw --csv > "$out/$name/raw.csv" 2>/dev/null
  # Each SASS instruction's samples (where the warps stall), then the report
  # goes: the two CSVs hold what it does and it is too large to bring back.
  ncu --import "$out/$name/report.ncu-rep" --page source --csv --print-source=sass \
    2>/dev/null | gzip -9 > "$out/$name/sass.csv.gz"
  rm -f "$out/$name/report.ncu-rep"
  pack_runs "$out" "${RUNS[@]}"
done
echo "## kernels"
grep '^|' "$out/kernels.log"
for mask in causal causal_document; do
  echo "## ncu, $mask 32k"
  python3 experiments/lab/ncu_table.py "$out/ncu-$mask/raw.csv"
done
