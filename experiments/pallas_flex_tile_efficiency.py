"""How much of jax.pallas_flex's lost speed on a mask is its tiles' waste
(issue #6; host-side, no GPU):

    python3 experiments/pallas_flex_tile_efficiency.py ROWS_DIR [ROWS_DIR ...] [--block=128]

For every workload with pallas_flex rows (fwd and bwd, OK) in the given
result folders, and the full mask at the same length, heads, head_dim and
dtype: the mask's exact
area over the area of the tiles its plan computes (`useful`, what
128 x 128 tiles can reach at best against the full mask), the same if
every slice had tiles of its own aligned to its first row and column
(`aligned`: a bound for plans cut at document starts), the share of the
plan's tiles that are partial, the measured TFLOP/s over the full mask's
(`fwd / full`, `bwd / full`), and that ratio over `useful`: the rate per
computed tile against the full mask's. A mask drawn from documents is
named with its document distribution and sampler. Prints a markdown table.

    python3 experiments/pallas_flex_tile_efficiency.py --shapes

instead prints, without rows, the useful fraction of plans of other tile
shapes (64 query rows: one compute warpgroup's share of a 128-row block;
64 key columns: half a K/V tile) on the seed blog's masks at 16k-64k,
documents drawn both ways: what tiles that follow the mask more finely
could gain.
"""

from __future__ import annotations

from absl import app, flags

from jax_backends.pallas_flex.plan import make_plan
from lcab import results
from lcab.masks.mask import AttnMask
from lcab.masks.slices import AttnSlice
from lcab.model.validation import mask_of

_BLOCK = flags.DEFINE_integer("block", 128, "the plan's q and kv block (the Mosaic kernels' 128)")
_SHAPES = flags.DEFINE_bool("shapes", False, "print the useful fraction of other tile shapes "
                            "on the seed blog's masks instead (no rows read)")
TILE_SHAPES = ((128, 128), (64, 128), (128, 64), (64, 64))  # (q rows, kv columns)
SHAPE_MASKS = ("causal_document", "full_document", "varlen_block_causal", "sliding_window_causal")
SHAPE_LENGTHS = (16384, 32768, 65536)


def aligned_tiles(mask: AttnMask, block: int) -> int:
    """Tiles computed if each slice were planned alone, from its own corner."""
    tiles = 0
    for piece in mask.slices:
        rows, cols = piece.q_end - piece.q_start, piece.k_end - piece.k_start
        alone = AttnMask(rows, cols, [AttnSlice(0, rows, 0, cols, piece.kind)])
        tiles += make_plan(alone, block, block).tiles()
    return tiles


def _label(row) -> str:
    params = results.json_field(row["mask_params"])
    documents = params.get("distribution")
    if not documents:
        return row["mask"]
    # The sampler moves the waste a lot: magi_pack's cap at a quarter of
    # the length leaves fewer, shorter documents' edges than uncapped.
    sampler = params.get("sampler", "uncapped")
    return f"{row['mask']} ({documents}, {sampler})"


def shapes_table() -> list[str]:
    """The useful fraction (exact area over computed tiles) of a plan of
    each TILE_SHAPES on SHAPE_MASKS (the seed blog's window and documents,
    both samplers), as markdown lines."""
    from lcab.masks import make_mask, taken_params

    heads = " | ".join(f"{rows} x {cols}" for rows, cols in TILE_SHAPES)
    lines = [f"| mask | sampler | length | {heads} |", "|---" * (3 + len(TILE_SHAPES)) + "|"]
    for name in SHAPE_MASKS:
        samplers = ("uncapped", "magi_pack") if "document" in name else (None,)
        for sampler, length in ((s, n) for s in samplers for n in SHAPE_LENGTHS):
            mask = make_mask(name, length, seed=0, **taken_params(
                name, distribution="chatqa2_long_sft", sampler=sampler, window=1024))
            useful = [mask.area() / (make_plan(mask, rows, cols).tiles() * rows * cols)
                      for rows, cols in TILE_SHAPES]
            lines.append(f"| {name} | {sampler or '-'} | {length // 1024}k | "
                         + " | ".join(f"{u:.3f}" for u in useful) + " |")
    return lines


def main(argv):
    if _SHAPES.value:
        print("\n".join(shapes_table()))
        return
    block = _BLOCK.value
    frame = results.load(argv[1:])
    rows = frame[(frame["backend"] == "jax.pallas_flex") & (frame["status"] == "OK")]
    setting = ["heads_q", "heads_kv", "head_dim", "dtype"]  # full must match all of them
    figure = {(r.mask_fingerprint, *(getattr(r, c) for c in setting), r.direction): r.tflops
              for r in rows.itertuples()}
    full = {(r.seqlen, *(getattr(r, c) for c in setting), r.direction): r.tflops
            for r in rows.itertuples() if r.mask == "full"}
    print("| mask | length | useful | aligned | partial tiles | fwd / full | bwd / full "
          "| per computed tile, fwd / bwd |")
    print("|---|---|---|---|---|---|---|---|")
    cases = rows.drop_duplicates(["mask_fingerprint", *setting]).copy()
    cases["label"] = cases.apply(_label, axis=1)
    for _, row in cases.sort_values(["label", "seqlen"]).iterrows():
        length, same = row["seqlen"], [row[c] for c in setting]
        keys = [((row["mask_fingerprint"], *same, d), (length, *same, d)) for d in ("fwd", "bwd")]
        if any(own not in figure or of_full not in full for own, of_full in keys):
            continue
        mask = mask_of(row)  # checked against the row's fingerprint
        plan = make_plan(mask, block, block)
        useful = mask.area() / (plan.tiles() * block ** 2)
        aligned = mask.area() / (aligned_tiles(mask, block) * block ** 2)
        ratio = [figure[own] / full[of_full] for own, of_full in keys]
        print(f"| {row['label']} | {length // 1024}k | {useful:.2f} | {aligned:.2f} "
              f"| {plan.partial_tiles() / plan.tiles():.2f} | {ratio[0]:.2f} | {ratio[1]:.2f} "
              f"| {ratio[0] / useful:.2f} / {ratio[1] / useful:.2f} |")


if __name__ == "__main__":
    app.run(main)
