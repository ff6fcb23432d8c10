"""python -m lcab.masks --out DIR: draw every mask family as PNG pictures."""

from absl import app, flags

_OUT = flags.DEFINE_string("out", "docs/masks", "Directory for the PNG pictures.")
_SEQLEN = flags.DEFINE_integer("seqlen", 256, "Sequence length to draw.", lower_bound=32)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from lcab.masks import draw

    for path in draw.draw_all(_OUT.value, _SEQLEN.value):
        print(path)


if __name__ == "__main__":
    app.run(main)
