"""jax.pallas_flex's kernels lowered for a GPU on the host (no GPU needed):
the Triton kernels to Triton IR, the Mosaic GPU forward and backward to
Mosaic GPU's MLIR on every family; what each lowering refuses, and the
backward's blocks following the lowering that runs."""

import functools
import itertools
import math
import re

import jax
import jax.numpy as jnp
import pytest

from jax_backends import _shared
from jax_backends.pallas_flex import mosaic_bwd_sm90, mosaic_fwd_sm90, mosaic_walk
from jax_backends.pallas_flex.ops import Lowering, flex_attention
from jax_backends.pallas_flex.plan import make_plan
from lcab import registry
from lcab.masks import MASK_NAMES, make_mask, small_mask
from lcab.workloads import Workload


def mosaic_forward_text(name, head_dim=128, dtype=jnp.bfloat16, block_k=128,
                        config=None) -> str:
    """The Mosaic forward for family `name` at 300 tokens (padded rows and
    columns) lowered for a GPU on the host: its text."""
    plan = make_plan(small_mask(name, 300), 128, block_k)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, head_dim), dtype)

    def forward(q, k, v, t):
        return mosaic_fwd_sm90.forward(q, k, v, plan.geometry, t,
                                       config or mosaic_fwd_sm90.Config())

    return jax.jit(forward).trace(q, kv, kv, tables).lower(
        lowering_platforms=("cuda",)).as_text()


def mosaic_backward_text(name, config, head_dim, dtype, heads_together, dkv_split=1) -> str:
    """The same for the Mosaic backward's two kernels (4:2 heads)."""
    plan = make_plan(small_mask(name, 300), 128, 128)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, head_dim), dtype)
    rows = jax.ShapeDtypeStruct((2, 4, plan.padded_q), jnp.float32)

    def gradients(q, k, v, dout, lse2, delta, t):
        return mosaic_bwd_sm90.backward(q, k, v, dout, lse2, delta, plan.geometry, t,
                                        heads_together, config, dkv_split=dkv_split)

    return jax.jit(gradients).trace(q, kv, kv, q, rows, rows, tables).lower(
        lowering_platforms=("cuda",)).as_text()


def test_the_kernels_lower_to_triton_for_a_gpu():
    """Lowering to Triton IR needs no GPU: this catches what interpret mode
    would let through (ops the Triton lowering lacks, type clashes)."""
    mask = make_mask("causal_document", 1000)  # not a multiple of any block
    forward_plan, backward_plan = make_plan(mask, 128, 64), make_plan(mask, 64, 64)
    q = jax.ShapeDtypeStruct((1, 1000, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1000, 2, 128), jnp.bfloat16)

    def loss(q, k, v):
        out, lse = flex_attention(q, k, v, forward_plan, backward_plan, Lowering())
        return out.astype(jnp.float32).sum() + lse.sum()

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
        lowering_platforms=("cuda",)).as_text()
    assert all(kernel in text for kernel in ("lcab_flex_forward", "lcab_flex_dq",
                                             "lcab_flex_dkv"))


@pytest.mark.parametrize("head_dim,dtype,block_k", [
    (128, jnp.bfloat16, 128), (64, jnp.float16, 64), (256, jnp.bfloat16, 64),
    (128, jnp.bfloat16, 192), (64, jnp.float16, 192)])
def test_the_mosaic_forward_lowers_for_a_gpu_on_every_family(head_dim, dtype, block_k):
    """Mosaic GPU's interpret mode cannot run this kernel (mosaic_fwd_sm90
    says why), so on a CPU it is lowered to Mosaic GPU's MLIR instead: that
    catches ops and layouts the lowering lacks; its numbers are checked on a
    GPU (results/gpu/2026-11-26-h100-pallas-flex-mosaic/)."""
    for name in MASK_NAMES:
        text = mosaic_forward_text(name, head_dim=head_dim, dtype=dtype, block_k=block_k)
        assert text.count("stablehlo.custom_call @mosaic_gpu") == 1, name
        # The compute warpgroups take turns through named barriers 4 and 5
        # of both warpgroups' 256 threads (each hands over, each waits).
        assert all(f"bar.{op} {barrier}, 256;" in text
                   for op in ("arrive", "sync") for barrier in (4, 5)), name


@pytest.mark.parametrize("head_dim,dtype,block_k", [
    (128, jnp.bfloat16, 128), (64, jnp.float16, 64), (192, jnp.bfloat16, 64)])
def test_the_persistent_mosaic_forward_lowers_for_a_gpu_on_every_family(head_dim, dtype,
                                                                       block_k):
    """v23's grid of one program per SM (3 here, for 2 x 3 x 4 items): its
    own kernel and the turns, on every family (numbers: a GPU's to check,
    tests/test_pallas_flex_kernels.py)."""
    config = mosaic_fwd_sm90.Config(persistent=True, programs=3)
    for name in MASK_NAMES:
        text = mosaic_forward_text(name, head_dim=head_dim, dtype=dtype, block_k=block_k,
                                   config=config)
        assert text.count("stablehlo.custom_call @mosaic_gpu") == 1, name
        assert "lcab_flex_forward_persistent" in text, name
        assert all(f"bar.{op} {barrier}, 256;" in text
                   for op in ("arrive", "sync") for barrier in (4, 5)), name
    default = mosaic_forward_text("causal", head_dim=head_dim, dtype=dtype, block_k=block_k)
    assert "lcab_flex_forward_mosaic" in default and "persistent" not in default


@pytest.mark.parametrize("heads_together", [True, False])
@pytest.mark.parametrize("programs", [1, 4, 7, 30, 200])
def test_a_persistent_grid_takes_every_item_once_in_launch_order(heads_together, programs):
    """Programs take items in rounds, each round's order the last one's
    reversed (a snake): together every item once, and item i is the
    (q block, head, batch) that launch_grid starts i-th when each has a
    program of its own."""
    q_blocks, heads, batch = 3, 5, 2
    items = mosaic_fwd_sm90.WorkItems(q_blocks, heads, batch, heads_together, programs)
    assert items.programs == min(programs, 30)
    taken = {program: [int(items.item(jnp.int32(program), jnp.int32(n)))
                       for n in range(int(items.share(jnp.int32(program))))]
             for program in range(items.programs)}
    assert sorted(itertools.chain(*taken.values())) == list(range(items.count))
    if items.programs == 4:  # 30 items: rounds of 4, the eighth holding 2
        assert taken[0] == [0, 7, 8, 15, 16, 23, 24] and taken[1] == [1, 6, 9, 14, 17, 22, 25]
        # the eighth round runs backwards: its two items go to the last programs
        assert taken[2] == [2, 5, 10, 13, 18, 21, 26, 29]
        assert taken[3] == [3, 4, 11, 12, 19, 20, 27, 28]
    grid, names = mosaic_walk.launch_grid(("q_seq", q_blocks), ("heads", heads), batch,
                                          heads_together)
    launched = [dict(zip(names, index)) for index in itertools.product(*map(range, grid))]
    assert [tuple(int(x) for x in items.where(jnp.int32(i))) for i in range(items.count)] == [
        (at["q_seq"], at["heads"], at["batch"]) for at in launched]


def test_the_persistent_forward_is_an_option_with_its_own_limits(monkeypatch):
    """forward_grid=persistent reaches the Mosaic forward's config; its Q
    and output tiles apart do not fit head_dim 256, which it says; its grid
    is one program per SM (the GPU's count, 132 lowered on a CPU), or one
    per item where there are fewer."""
    from jax_backends.pallas_flex import ops

    persistent = mosaic_fwd_sm90.Config(persistent=True)
    problem = mosaic_fwd_sm90.problem
    assert problem(128, 128, "bfloat16", 128, persistent) is None
    assert problem(128, 64, "bfloat16", 192, persistent) is None
    assert "persistent Mosaic forward needs 265296 bytes" in problem(128, 64, "bfloat16", 256,
                                                                      persistent)
    long_full = make_plan(small_mask("full", 32768), 128, 128).geometry
    backend = registry.load_backend("jax.pallas_flex", {"forward_grid": "persistent"})
    assert backend.lowering.forward_grid == "persistent"
    assert backend.lowering.mosaic_forward_for(long_full, "bfloat16", 128) == persistent
    assert "forward_grid=persistent" in backend.mask_support(cpu_workload()).how
    default = registry.load_backend("jax.pallas_flex", {})
    assert default.lowering.forward_grid == "auto"
    assert default.forward_launch(cpu_workload())[0] is None  # Triton here: one grid
    with pytest.raises(registry.Unavailable, match="choose one of auto, per_item, persistent"):
        registry.load_backend("jax.pallas_flex", {"forward_grid": "sm"})

    launched = mosaic_grids(monkeypatch)
    lowering = Lowering(forward="mosaic", forward_grid="persistent")
    for blocks, heads in ((5, 6), (40, 8)):  # 60 and 640 items
        plan = make_plan(small_mask("causal", 128 * blocks), 128, 128)
        q = jax.ShapeDtypeStruct((2, 128 * blocks, heads, 128), jnp.bfloat16)
        kv = jax.ShapeDtypeStruct((2, 128 * blocks, 2, 128), jnp.bfloat16)
        forward = functools.partial(ops.flex_attention, forward_plan=plan, lowering=lowering)
        jax.jit(forward).trace(q, kv, kv).lower(lowering_platforms=("cuda",))
    assert launched == [(60, 1, 1), (132, 1, 1)]  # padded to CUDA's three axes


@pytest.mark.parametrize("name,seqlen,head_dim,grid", [
    ("full", 16384, 128, "persistent"),  # 16k keys a program: at the limit
    ("full", 32768, 128, "per_item"),
    ("causal", 32768, 128, "per_item"),  # 16,448 keys on average
    ("sliding_window_causal", 32768, 128, "persistent"),
    ("full", 4096, 256, "per_item"),  # the persistent tiles do not fit
])
def test_the_default_grid_is_persistent_where_programs_walk_few_keys(monkeypatch, name,
                                                                     seqlen, head_dim, grid):
    """forward_grid "auto" (the default) lowers the persistent kernel where
    a program walks at most 16k keys on average and its tiles fit, the
    kernel of a program per item elsewhere; the backend's probe is pinned
    to the same grid and the row's note says so."""
    from jax_backends.pallas_flex import ops

    block_k = 128 if head_dim <= 128 else 64
    mask = make_mask(name, seqlen)
    plan = make_plan(mask, 128, block_k)
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    config = Lowering(forward="mosaic").mosaic_forward_for(plan.geometry, jnp.bfloat16, head_dim)
    assert config.persistent == (grid == "persistent")
    assert Lowering(forward_grid="per_item").mosaic_forward_for(
        plan.geometry, jnp.bfloat16, head_dim) == mosaic_fwd_sm90.Config()

    backend = registry.load_backend("jax.pallas_flex", {"block_k": str(block_k),
                                                        "forward_lowering": "mosaic"})
    workload = Workload(1, seqlen, seqlen, 8, 1, head_dim, "bfloat16", mask)
    assert backend.forward_launch(workload)[0] == grid
    pinned, note = backend.pinned_to(workload)
    assert pinned.lowering.forward_grid == grid
    assert ("one program per SM" in note) == (grid == "persistent")
    # Rows head after head where a program walks 16k keys or more, pinned too.
    head_major = plan.geometry.row_keys >= 16384
    assert backend.forward_launch(workload)[1] == (
        "head_major" if head_major else "heads_together")
    assert pinned.lowering.rows_launch == ("head_major" if head_major else "auto")
    assert ("rows head after head" in note) == head_major
    # Under CP the forward keeps a program per item, heads together
    # (unmeasured there).
    assert type(backend).cp_inner_defaults["forward_grid"] == "per_item"
    assert type(backend).cp_inner_defaults["rows_launch"] == "heads_together"

    launched = mosaic_grids(monkeypatch)
    q = jax.ShapeDtypeStruct((1, plan.padded_q, 2, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, plan.padded_k, 1, head_dim), jnp.bfloat16)
    forward = functools.partial(ops.flex_attention, forward_plan=plan,
                                lowering=Lowering(forward="mosaic"))
    jax.jit(forward).trace(q, kv, kv).lower(lowering_platforms=("cuda",))
    items = 2 * plan.num_q_blocks  # heads x q blocks
    want = (min(items, 132), 1, 1) if grid == "persistent" else None
    assert launched[0] == want if want else math.prod(launched[0]) == items


@pytest.mark.parametrize("name,seqlen,head_dim,options,block_k", [
    ("full", 32768, 128, {}, 192),
    ("causal", 32768, 128, {}, 192),  # 16,448 keys a program on average
    ("full", 16384, 128, {}, 128),  # 16,384: persistent at 128 keys
    ("causal", 24576, 128, {}, 128),
    ("sliding_window_causal", 32768, 128, {}, 128),
    ("longca_global_window", 32768, 128, {}, 128),  # 17,574 keys, but 2.8 % of tiles cut
    ("full", 32768, 64, {}, 128),  # measured at head_dim 128 alone
    ("full", 32768, 128, {"block_k": "128"}, 128),  # set: kept
    ("full", 32768, 128, {"forward_grid": "persistent"}, 128),  # 192 has no persistent grid
])
def test_the_default_key_block_is_wide_where_programs_walk_long_rows(monkeypatch, name, seqlen,
                                                                      head_dim, options, block_k):
    """With block_k unset the Mosaic forward steps 192 keys where a program
    would walk more than 16k keys on average at 128, at most 1 % of the
    tiles are cut and head_dim is 128, 128 elsewhere; the plan, the
    probe's pin, the probe's tilings and the row's note follow it, and CP
    inner kernels keep 128."""
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    backend = registry.load_backend("jax.pallas_flex", {"forward_lowering": "mosaic", **options})
    workload = Workload(1, seqlen, seqlen, 8, 1, head_dim, "bfloat16", make_mask(name, seqlen))
    assert backend.forward_blocks_for(workload) == (128, block_k)
    assert backend.plans(workload)[0].geometry.block_k == block_k
    assert backend.probe_needs(workload).tilings[0] == (128, block_k)
    pinned, note = backend.pinned_to(workload)
    assert pinned.forward_blocks == (128, block_k) and pinned.set_options == backend.set_options
    wide = block_k == 192 and "block_k" not in options
    assert ("192 keys a step" in note) == wide
    assert ("192-key steps" in backend.mask_support(workload).how) == wide
    if wide:  # one program per item: 192-key tiles leave no room for the persistent grid's
        assert backend.forward_launch(workload)[0] == "per_item"
    assert type(backend).cp_inner_defaults["block_k"] == "128"


def test_the_shared_memory_counts_are_mosaics_own(monkeypatch):
    """mosaic_fwd_sm90.shared_memory, which decides what `problem`
    refuses, counts what Mosaic GPU asks the GPU for (its launch's count,
    read as it lowers on a CPU): the buffers on 1 KiB boundaries, the
    mbarriers, the softmax's reduction scratch."""
    from jax.experimental.mosaic.gpu import core as mosaic_core

    asked = []
    launch = mosaic_core._launch

    def spy(token, grid, cluster, block, smem_buffers, *args, **kwargs):
        asked.append(mosaic_core._smem_tree_size(smem_buffers))
        return launch(token, grid, cluster, block, smem_buffers, *args, **kwargs)

    monkeypatch.setattr(mosaic_core, "_launch", spy)
    for head_dim, block_k, persistent in ((128, 128, True), (128, 128, False), (192, 64, True),
                                          (128, 192, False)):
        config = mosaic_fwd_sm90.Config(persistent=persistent, programs=3 if persistent else None)
        mosaic_forward_text("causal", head_dim=head_dim, block_k=block_k, config=config)
        assert asked.pop() == mosaic_fwd_sm90.shared_memory(block_k, jnp.bfloat16, head_dim,
                                                            config)


@pytest.mark.parametrize("head_dim,dtype,heads_together,parts", [
    (128, jnp.bfloat16, False, 1), (64, jnp.float16, True, 1), (128, jnp.bfloat16, True, 2)])
def test_the_mosaic_backward_lowers_for_a_gpu_on_every_family(head_dim, dtype, heads_together,
                                                              parts):
    """As the forward: lowered to Mosaic GPU's MLIR, both kernels, every
    family (its numbers are for a GPU to check)."""
    config = mosaic_bwd_sm90.Config(parts=parts)
    for name in MASK_NAMES:
        text = mosaic_backward_text(name, config, head_dim, dtype, heads_together)
        assert "lcab_flex_dq_mosaic" in text and "lcab_flex_dkv_mosaic" in text, name


def test_the_mosaic_dkv_kernel_lowers_split_over_query_heads():
    """dkv_split=2 at 4:2 heads: the dK/dV kernel runs over 4 K/V heads (each
    repeated), one query head each, and its shares come back summed to 2."""
    padded = make_plan(small_mask("causal", 300), 128, 128).geometry.padded_k
    for name in ("causal", "causal_document"):
        split = mosaic_backward_text(name, mosaic_bwd_sm90.Config(), 128, jnp.bfloat16, False, 2)
        whole = mosaic_backward_text(name, mosaic_bwd_sm90.Config(), 128, jnp.bfloat16, False)
        # dK/dV's 4 heads as 2 K/V heads' 2 shares each, summed in float32.
        shares = f"tensor<2x{padded}x2x2x128xbf16>"
        assert "lcab_flex_dkv_mosaic" in split and shares in split and shares not in whole
        assert f"tensor<2x{padded}x2x2x128xf32>" in split


def mosaic_grids(monkeypatch) -> list:
    """The CUDA grid (x, y, z) of every Mosaic GPU kernel lowered from here
    on, taken from JAX's own lowering; Mosaic lowers on a CPU meanwhile."""
    from jax._src.pallas.mosaic_gpu import lowering as mosaic_lowering

    launched = []
    lower = mosaic_lowering.lower_pipelined_jaxpr_to_module

    def spy(*args, **kwargs):
        result = lower(*args, **kwargs)
        launched.append(tuple(result.grid))
        return result

    monkeypatch.setattr(mosaic_lowering, "lower_pipelined_jaxpr_to_module", spy)
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    return launched


def mosaic_modules(monkeypatch) -> list:
    """Every Mosaic GPU kernel lowered from here on (JAX's lowering results:
    .module, .grid), in order; Mosaic lowers on a CPU meanwhile."""
    from jax._src.pallas.mosaic_gpu import lowering as mosaic_lowering

    modules = []
    lower = mosaic_lowering.lower_pipelined_jaxpr_to_module
    monkeypatch.setattr(mosaic_lowering, "lower_pipelined_jaxpr_to_module",
                        lambda *args, **kwargs: modules.append(lower(*args, **kwargs))
                        or modules[-1])
    return modules

def cpu_workload(head_dim=64):
    return Workload(1, 256, 256, 4, 2, head_dim, "bfloat16", small_mask("causal", 256))


def test_the_mosaic_forward_says_what_it_cannot_take():
    problem = mosaic_fwd_sm90.problem
    assert problem(128, 128, "bfloat16", 128) is None and problem(128, 64, "float16", 256) is None
    assert "bf16 or f16" in problem(128, 128, "float32", 128)
    assert "head_dim 64, 128, 192 or 256" in problem(128, 128, "bfloat16", 32)
    assert "block_q=128" in problem(64, 128, "bfloat16", 128)
    assert "64 above head_dim 128" in problem(128, 128, "bfloat16", 256)
    # 192-key steps (v26): one program per item, at head_dim 128 and below;
    # the persistent grid's output tile would not fit beside their ring.
    assert problem(128, 192, "bfloat16", 128) is None
    assert "64, 128 or 192" in problem(128, 96, "bfloat16", 128)
    assert "64 above head_dim 128" in problem(128, 192, "bfloat16", 192)
    persistent = mosaic_fwd_sm90.Config(persistent=True)
    assert "persistent Mosaic forward needs 263248 bytes" in problem(
        128, 192, "bfloat16", 128, persistent)
    wide = make_plan(make_mask("causal_document", 4096), 128, 192).geometry
    assert not Lowering().mosaic_forward_for(wide, jnp.bfloat16, 128).persistent
    # On a CPU "auto" takes the Triton forward; "mosaic" is refused with its reason.
    auto = registry.load_backend("jax.pallas_flex", {})
    assert auto.lowering.forward == "auto"
    assert "forward Triton, backward Triton" in auto.mask_support(cpu_workload()).how
    mosaic = registry.load_backend("jax.pallas_flex", {"forward_lowering": "mosaic"})
    support = mosaic.mask_support(cpu_workload())
    assert not support.ok and "forward_lowering=mosaic: needs a CUDA GPU" in support.reason
    # Triton's tiles are powers of two: 192 keys are the Mosaic forward's alone.
    wide = registry.load_backend("jax.pallas_flex", {"block_k": 192}).mask_support(
        cpu_workload())
    assert not wide.ok and "block_k=192 takes the Mosaic forward" in wide.reason
    with pytest.raises(registry.Unavailable, match="or block_k=192"):
        registry.load_backend("jax.pallas_flex", {"block_k": 96})
    with pytest.raises(ValueError, match="choose one of auto, triton, mosaic"):
        Lowering(forward="wgmma")
    with pytest.raises(ValueError, match="no interpret mode"):
        Lowering(interpret=True, forward="mosaic")
    with pytest.raises(ValueError, match="stages=1"):
        mosaic_fwd_sm90.Config(stages=1)
    with pytest.raises(TypeError, match="fused"):  # the configs refuse unknown fields
        mosaic_fwd_sm90.Config(fused=True)


def test_the_mosaic_backward_says_what_it_cannot_take():
    problem = mosaic_bwd_sm90.problem
    assert problem(128, 128, "bfloat16", 128) is None and problem(128, 128, "float16", 64) is None
    assert "bf16 or f16" in problem(128, 128, "float32", 128)
    assert "head_dim 64 or 128" in problem(128, 128, "bfloat16", 256)
    assert "backward blocks 128 x 128, not 64 x 64" in problem(64, 64, "bfloat16", 128)
    assert Lowering().backward == "auto"
    mosaic = registry.load_backend("jax.pallas_flex", {"backward_lowering": "mosaic"})
    support = mosaic.mask_support(cpu_workload())
    assert not support.ok and "backward_lowering=mosaic: needs a CUDA GPU" in support.reason
    with pytest.raises(ValueError, match="choose one of auto, triton, mosaic"):
        Lowering(backward="wgmma")
    with pytest.raises(ValueError, match="backward=mosaic has no interpret mode"):
        Lowering(interpret=True, backward="mosaic")
    with pytest.raises(ValueError, match="parts=3: choose one of 1, 2"):
        mosaic_bwd_sm90.Config(parts=3)


def test_the_backward_blocks_follow_the_backward_that_runs(monkeypatch):
    """128 x 128 where the Mosaic backward runs (a Hopper GPU, faked here),
    64 x 64 for the Triton one: on a CPU, for float32 or head_dim 32; blocks
    that are set always win."""
    auto = registry.load_backend("jax.pallas_flex", {})
    assert auto.backward_blocks("bfloat16", 128) == (64, 64)  # this CPU
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    monkeypatch.setattr(_shared, "interpret_mode", lambda: False)
    auto = registry.load_backend("jax.pallas_flex", {})
    assert auto.backward_blocks("bfloat16", 128) == (128, 128)
    assert auto.backward_blocks("float16", 64) == (128, 128)
    assert auto.backward_blocks("float32", 128) == (64, 64)
    assert auto.backward_blocks("bfloat16", 32) == (64, 64)
    triton = registry.load_backend("jax.pallas_flex", {"backward_lowering": "triton"})
    assert triton.backward_blocks("bfloat16", 128) == (64, 64)
    set_blocks = registry.load_backend("jax.pallas_flex", {"backward_block_q": 32})
    assert set_blocks.backward_blocks("bfloat16", 128) == (32, 128)
    workload = cpu_workload(head_dim=128)
    backward_plan = auto.plans(workload)[1]
    assert (backward_plan.block_q, backward_plan.block_k) == (128, 128)
    assert "forward Mosaic GPU, backward Mosaic GPU" in auto.mask_support(workload).how


@pytest.mark.parametrize("heads_together", [True, False])
def test_the_mosaic_launch_orders_are_the_ones_named(monkeypatch, heads_together):
    """CUDA starts a grid's programs with blockIdx.x varying fastest, and
    Mosaic GPU maps a kernel's grid onto x, y, z reversed (Triton maps it
    as given). The CUDA grids are taken from JAX's own lowering here:
    "heads together" must put the heads on x, "head major" the blocks."""
    launched = mosaic_grids(monkeypatch)
    batch, blocks, heads, kv_heads = 2, 5, 6, 3  # all different, so each axis is known
    plan = make_plan(small_mask("causal", 128 * blocks), 128, 128)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    q = jax.ShapeDtypeStruct((batch, plan.padded_q, heads, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((batch, plan.padded_k, kv_heads, 128), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((batch, heads, plan.padded_q), jnp.float32)

    def both(q, k, v, dout, lse2, delta, t):
        out = mosaic_fwd_sm90.forward(q, k, v, plan.geometry, t,
                                      heads_together=heads_together)
        grads = mosaic_bwd_sm90.backward(q, k, v, dout, lse2, delta, plan.geometry, t,
                                         heads_together=heads_together,
                                         dq_heads_together=heads_together)
        return out, grads

    jax.jit(both).trace(q, kv, kv, q, rows, rows, tables).lower(lowering_platforms=("cuda",))
    forward, dq, dkv = launched
    if heads_together:
        assert forward == dq == (heads, blocks, batch) and dkv == (kv_heads, blocks, batch)
    else:
        assert forward == dq == (blocks, heads, batch) and dkv == (blocks, kv_heads, batch)


def test_the_launch_orders_are_options_that_reach_the_lowering():
    backend = registry.load_backend("jax.pallas_flex", {"dkv_launch": "heads_together",
                                                        "rows_launch": "head_major"})
    assert (backend.lowering.dkv_launch, backend.lowering.rows_launch) == (
        "heads_together", "head_major")
    assert "dkv_launch=heads_together; rows_launch=head_major" in backend.mask_support(
        cpu_workload()).how
    default = registry.load_backend("jax.pallas_flex", {})
    assert (default.lowering.dkv_launch, default.lowering.rows_launch) == ("auto", "auto")
    with pytest.raises(registry.Unavailable,
                       match="choose one of auto, heads_together, head_major"):
        registry.load_backend("jax.pallas_flex", {"rows_launch": "sideways"})


def dkv_traffic(monkeypatch, config) -> str:
    """The Mosaic dK/dV kernel's waits, products and column loads in program
    order, as lowered for a GPU on the host: "B" an mbarrier wait, "L" a run
    of float32 loads from shared memory (lse, delta), "m" a run of wgmma
    instructions, "C" a commit of a group, "W" a wait for wgmma results."""
    modules = mosaic_modules(monkeypatch)
    plan = make_plan(small_mask("causal_document", 512), 128, 128)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    q = jax.ShapeDtypeStruct((1, plan.padded_q, 2, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, plan.padded_k, 1, 128), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((1, 2, plan.padded_q), jnp.float32)

    def gradients(q, k, v, dout, lse2, delta, t):
        return mosaic_bwd_sm90.backward(q, k, v, dout, lse2, delta, plan.geometry, t,
                                        config=config)

    jax.jit(gradients).trace(q, kv, kv, q, rows, rows, tables).lower(
        lowering_platforms=("cuda",))
    assert len(modules) == 2  # dQ's kernel, then dK/dV's
    steps = []
    for line in str(modules[1].module).splitlines():
        step = ("m" if "wgmma.mma_async" in line else "C" if "wgmma.commit.group" in line
                else "W" if "wgmma.wait.group" in line else "B" if "mbarrier.try_wait" in line
                else "L" if re.search(r"llvm\.load .*!llvm\.ptr<3> -> vector<2xf32>", line)
                else None)
        if step and not (step in "mL" and steps[-1:] == [step]):
            steps.append(step)
    return " ".join(steps)


def test_dkv_reads_lse_and_delta_before_the_products_they_follow(monkeypatch):
    """v28: a dK/dV strip reads its lse (after its barrier) before S^T's
    product is issued and its delta before dV's and dP^T's; read after
    those were waited for, the backward measured 2.5-7 % slower."""
    traffic = dkv_traffic(monkeypatch, mosaic_bwd_sm90.Config(parts=1))
    # A strip: q's and lse's barriers, lse, S^T; dO's and delta's barriers,
    # delta, dV and dP^T; dK.
    assert "B B L m C W B B L m C m C W m C W" in traffic
    assert "B m C W B L" not in traffic  # no load waits behind a product
    with pytest.raises(registry.Unavailable, match="has no option 'dkv_loads'"):
        registry.load_backend("jax.pallas_flex", {"dkv_loads": "early"})


def test_the_mosaic_kernels_test_partial_tiles_as_measured_fastest():
    """The forward by offset, dQ by bounds, dK/dV by folded
    (docs/pallas_flex.md, v12-v14: each kernel's winner on one H200); the
    options that chose between them left with the losers."""
    assert mosaic_fwd_sm90.FORWARD_MASK_TEST == "offset"
    assert (mosaic_bwd_sm90.DQ_MASK_TEST, mosaic_bwd_sm90.DKV_MASK_TEST) == ("bounds", "folded")
    for gone in ("forward_schedule", "mask_test", "dq_mask_test", "dkv_mask_test"):
        with pytest.raises(registry.Unavailable, match=f"no option '{gone}'"):
            registry.load_backend("jax.pallas_flex", {gone: "offset"})


@pytest.mark.parametrize("dkv_launch,rows_launch", [("head_major", "heads_together"),
                                                    ("heads_together", "head_major")])
def test_each_pass_takes_its_own_launch_order_through_ops(monkeypatch, dkv_launch,
                                                          rows_launch):
    """ops hands dK/dV the dkv_launch and forward and dQ the rows_launch
    (checked where they differ, so a swap of the two would show)."""
    from jax_backends.pallas_flex import ops

    launched = mosaic_grids(monkeypatch)
    batch, blocks, heads, kv_heads = 2, 5, 6, 3
    plan = make_plan(small_mask("causal", 128 * blocks), 128, 128)
    lowering = Lowering(forward="mosaic", backward="mosaic", dkv_launch=dkv_launch,
                        rows_launch=rows_launch, dkv_split="1",  # the split: its own test
                        forward_grid="per_item")  # the persistent deal: its own test
    q = jax.ShapeDtypeStruct((batch, 128 * blocks, heads, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((batch, 128 * blocks, kv_heads, 128), jnp.bfloat16)

    def loss(q, k, v):
        out, _ = ops.flex_attention(q, k, v, plan, plan, lowering)
        return out.astype(jnp.float32).sum()

    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
        lowering_platforms=("cuda",))
    rows = (heads, blocks, batch) if rows_launch == "heads_together" else (blocks, heads, batch)
    dkv = (kv_heads, blocks, batch) if dkv_launch == "heads_together" else (
        blocks, kv_heads, batch)
    assert sorted(launched) == sorted([rows, rows, dkv])  # forward, dQ, dK/dV


def forward_module(monkeypatch, config, name="sliding_window_causal") -> str:
    """The Mosaic forward's kernel as lowered for a GPU on the host, as text."""
    modules = mosaic_modules(monkeypatch)
    mosaic_forward_text(name, config=config)
    assert len(modules) == 1
    return str(modules[0].module)


def wgmma_traffic(text: str) -> str:
    """The kernel's wgmma groups, waits, turns and exponentials in program
    order: C a committed group, W<n> a wait for at most n in flight, A/S a
    turn barrier arrived at or synced on, E a run of exponentials."""
    codes = {"commit": "C", "bar.arrive": "A", "bar.sync": "S", "ex2": "E"}
    found = re.findall(r"wgmma\.(commit)\.group|wgmma\.wait\.group\.sync\.aligned (\d)"
                       r"|(bar\.arrive|bar\.sync) [45]|(ex2)\.approx", text)
    traffic = "".join(codes[commit or turn or ex2] if not wait else f"W{wait}"
                      for commit, wait, turn, ex2 in found)
    return re.sub(r"E+", "E", re.sub(r"A+", "A", re.sub(r"S+", "S", traffic)))


@pytest.mark.parametrize("persistent", [False, True])
def test_the_forward_can_run_a_tiles_softmax_under_the_last_p_at_v(monkeypatch, persistent):
    """v33 (option forward_overlap=intra): in a visit after an item's
    first, one turn issues the tile's scores and the last tile's P @ V
    (two groups of 8 m64n128k16 steps each) and waits for the scores alone
    (wait 1); the softmax's exponentials run before the wait for P @ V
    (wait 0). The item's first visit issues its scores alone, and one more
    turn after the last visit issues the last P @ V (8 steps). Each visit
    waits for its own K tile and the last one's V tile, so the kernel waits
    on as many mbarriers as the default. Lowers on every family."""
    base = {"persistent": persistent, "programs": 3 if persistent else None}
    default = forward_module(monkeypatch, mosaic_fwd_sm90.Config(**base))
    overlap = forward_module(monkeypatch, mosaic_fwd_sm90.Config(overlap=True, **base))
    # two visit bodies (full runs, partial tiles), each: first visit 8, later 16; last 8
    assert default.count("m64n128k16") == 2 * 16
    assert overlap.count("m64n128k16") == 2 * (8 + 16) + 8
    assert overlap.count("mbarrier.try_wait") == default.count("mbarrier.try_wait")
    assert "W1" not in wgmma_traffic(default)
    later, first = "SCCAW1EW0", "CAW0E"  # a later visit's turn, then the first visit's
    assert wgmma_traffic(overlap).count(later + first) == 2
    assert wgmma_traffic(overlap).count("SCW0") == 1  # the last P @ V: a turn, no hand-over
    config = mosaic_fwd_sm90.Config(overlap=True, **base)
    for name in MASK_NAMES:
        text = mosaic_forward_text(name, config=config)
        assert text.count("stablehlo.custom_call @mosaic_gpu") == 1, name
    for block_k in (64, mosaic_fwd_sm90.WIDE_BLOCK_K):  # one program per item at 192 keys
        per_item = mosaic_fwd_sm90.Config(overlap=True)
        assert mosaic_forward_text("causal_document", block_k=block_k, config=per_item) != \
            mosaic_forward_text("causal_document", block_k=block_k), block_k


@pytest.mark.parametrize("persistent", [False, True])
def test_the_forward_takes_the_register_split_asked_for(monkeypatch, persistent):
    """forward_registers: the compute warpgroups raise their registers to
    the split's first count and the memory warpgroup lowers its own to the
    second (232 / 40 by default, FA3's 240 / 24 asked for), on either grid;
    nothing else in the kernel changes."""
    base = {"persistent": persistent, "programs": 3 if persistent else None}
    default = forward_module(monkeypatch, mosaic_fwd_sm90.Config(**base))
    fa3 = forward_module(monkeypatch, mosaic_fwd_sm90.Config(registers=(240, 24), **base))
    counts = lambda text: sorted(re.findall(r"setmaxregister (\w+ \d+)", text))
    assert counts(default) == ["decrease 40", "increase 232"]
    assert counts(fa3) == ["decrease 24", "increase 240"]
    assert re.sub(r"setmaxregister \w+ \d+", "", default) == \
        re.sub(r"setmaxregister \w+ \d+", "", fa3)
    with pytest.raises(ValueError, match="registers=\\(256, 24\\): choose one of"):
        mosaic_fwd_sm90.Config(registers=(256, 24))
    backend = registry.load_backend("jax.pallas_flex", {"forward_registers": "240"})
    assert backend.lowering.mosaic_forward_for(
        make_plan(small_mask("causal", 300), 128, 128).geometry, jnp.bfloat16,
        128).registers == (240, 24)
    assert registry.load_backend("jax.pallas_flex", {}).mosaic_forward.registers == (232, 40)
    with pytest.raises(registry.Unavailable, match="choose one of 232, 240"):
        registry.load_backend("jax.pallas_flex", {"forward_registers": "256"})


def test_the_overlap_option_reaches_the_mosaic_forward():
    backend = registry.load_backend("jax.pallas_flex", {"forward_overlap": "intra"})
    assert backend.lowering.mosaic_forward.overlap
    assert backend.lowering.mosaic_forward_for(
        make_plan(small_mask("causal", 300), 128, 128).geometry, jnp.bfloat16, 128).overlap
    assert not registry.load_backend("jax.pallas_flex", {}).lowering.mosaic_forward.overlap
    with pytest.raises(registry.Unavailable, match="choose one of none, intra"):
        registry.load_backend("jax.pallas_flex", {"forward_overlap": "some"})
    # Where the Triton forward runs (here, a CPU), the row's note says the
    # option went unused rather than label a default run "intra".
    workload = Workload(1, 200, 200, 4, 2, 32, "float32", small_mask("causal", 200))
    assert "forward_overlap unused" in backend.mask_support(workload).how
    both = registry.load_backend("jax.pallas_flex", {"forward_overlap": "intra",
                                                     "forward_registers": "240"})
    assert "(forward_overlap, forward_registers unused" in both.mask_support(workload).how
