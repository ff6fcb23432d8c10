"""How much of jax.pallas_flex's lost speed on a mask is its tiles' waste
(issue #6; host-side, no GPU):

    python3 experiments/pallas_flex_tile_efficiency.py ROWS_DIR [ROWS_DIR ...] [--block=128]

For every mask and length with pallas_flex rows (fwd and bwd, OK) in the
given result folders, and the full mask at the same length: the mask's
exact area over the area of the tiles its plan computes (`useful`, what
128 x 128 tiles can reach at best against the full mask), the share of
those tiles that are partial, the measured TFLOP/s over the full mask's
(`fwd / full`, `bwd / full`), and that ratio over `useful`: the rate per
computed tile against the full mask's. Prints a markdown table.
"""

from __future__ import annotations

from absl import app, flags

from jax_backends.flex_plan import make_plan
from lcab import results
from lcab.model.validation import mask_of

_BLOCK = flags.DEFINE_integer("block", 128, "the plan's q and kv block (the Mosaic kernels' 128)")


def main(argv):
    frame = results.load(argv[1:])
    rows = frame[(frame["backend"] == "jax.pallas_flex") & (frame["status"] == "OK")]
    figure = {(r.mask, r.seqlen, r.direction): r.tflops for r in rows.itertuples()}
    print("| mask | length | useful | partial tiles | fwd / full | bwd / full "
          "| per computed tile, fwd / bwd |")
    print("|---|---|---|---|---|---|---|")
    cases = rows.drop_duplicates(["mask", "seqlen"])
    for _, row in cases.sort_values(["mask", "seqlen"]).iterrows():
        name, length = row["mask"], row["seqlen"]  # not row.mask: a Series method
        if any(key not in figure for d in ("fwd", "bwd")
               for key in ((name, length, d), ("full", length, d))):
            continue
        mask = mask_of(row)  # checked against the row's fingerprint
        plan = make_plan(mask, _BLOCK.value, _BLOCK.value)
        useful = mask.area() / (plan.tiles() * _BLOCK.value ** 2)
        ratio = [figure[(name, length, d)] / figure[("full", length, d)] for d in ("fwd", "bwd")]
        print(f"| {name} | {length // 1024}k | {useful:.2f} "
              f"| {plan.partial_tiles() / plan.tiles():.2f} | {ratio[0]:.2f} | {ratio[1]:.2f} "
              f"| {ratio[0] / useful:.2f} / {ratio[1] / useful:.2f} |")

if __name__ == "__main__":
    app.run(main)
