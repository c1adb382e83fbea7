//! Property tests with arbitrary shapes and values: the stand-in for
//! cargo-fuzz, which needs a nightly toolchain this project does not have
//! (only stable is installed and nothing else can be fetched).
//!
//! They cover the float32 entry points of the witness (`segment_of`, the
//! witness indices, apply and scatter, the null models, coverage and recall),
//! block selection (`BlockSparseConfig::new`, one query, a batch, packed
//! sequences, positions of blocks), the selectors and the oracle top-k, the
//! attention pass (sparse, dense, MLA) and the metrics (attention
//! probabilities and the batched metrics against their row forms). They do
//! not cover the indexer, the checkers (`check`), the encoded key formats
//! and paged caches (`keys`, block selection's `*_encoded_into`,
//! `select_paged_into`, `block_scores_into`), the pool or the SIMD
//! controls: their tests are elsewhere (`tests/indexer.rs`,
//! `tests/block_cache.rs`, the unit tests in `src/`).
//!
//! Each property feeds hostile input -- mismatched lengths, negative and
//! huge integers, NaN and ±Inf floats, zero-size dimensions -- and checks:
//!
//! - no panic and no out-of-bounds access (proptest turns a panic into a
//!   failing, shrunk case);
//! - a call is refused exactly when its arguments are inconsistent, and a
//!   refused call leaves its output buffer untouched;
//! - the contracts of an accepted call: witnesses causal, distinct, one per
//!   uncovered segment and within budget, the retained prefix untouched;
//!   block selections causal, ascending, never empty for a query that sees
//!   a key, within `width`; selector and oracle rows causal and distinct;
//!   attention rows a convex combination of the selected values;
//! - and, where a plain oracle is short enough to write here, equality
//!   with it (witness rows; block selections on data whose dot products
//!   are exact; positions of blocks; oracle top-k).
//!
//! Case counts: `KVSELECT_PROPTEST_CASES` overrides every property's count
//! (the defaults keep the whole file to a few seconds in a debug build).

use kvselect::attention::{
    causal_mla_attention_sparse, dense_attention, oracle_topk_row, sparse_attention,
    AttentionShape, OracleTopK, Selector,
};
use kvselect::block_sparse::{
    block_sparse_select, positions_of_blocks, positions_of_blocks_i32, select_batch_into,
    select_into, select_packed_into, BlockSparseConfig,
};
use kvselect::metrics;
use kvselect::witness::{self, segment_of, MAX_TOPOLOGY_SEGMENTS};
use kvselect::ArgumentError;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// A property's config: `cases` unless `KVSELECT_PROPTEST_CASES` says
/// otherwise; no regression files written into the source tree.
fn cases(cases: u32) -> Config {
    let cases = std::env::var("KVSELECT_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// The sentinel an output buffer is filled with before a call, to see
/// whether a refused call wrote anything.
const SENTINEL: i32 = 0x5EED;

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// A learned-row entry: mostly small (in and just past a short context,
/// padding), sometimes any i32.
fn entry() -> impl Strategy<Value = i32> {
    prop_oneof![8 => -3i32..48, 1 => any::<i32>(), 1 => Just(i32::MAX), 1 => Just(i32::MIN)]
}

/// A context length: mostly short, sometimes zero, negative or huge.
fn context_len() -> impl Strategy<Value = i32> {
    prop_oneof![8 => 1i32..45, 1 => -2i32..=0, 1 => any::<i32>(), 1 => Just(i32::MAX)]
}

/// A length that is sometimes off by a little from what the shape needs.
fn skew() -> impl Strategy<Value = isize> {
    prop_oneof![12 => Just(0isize), 1 => -2isize..=2]
}

fn skewed(n: usize, skew: isize) -> usize {
    (n as isize + skew).max(0) as usize
}

/// A float: mostly small integers (so dot products are exact), sometimes
/// a special value.
fn special_float() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => (-4i32..5).prop_map(|x| x as f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(-0.0f32),
    ]
}

/// A float: anything at all, finite or not.
fn wild_float() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -8.0f32..8.0,
        1 => any::<f32>(),
        1 => special_float(),
        1 => Just(f32::MAX),
        1 => Just(f32::MIN_POSITIVE),
    ]
}

/// A position: mostly near the keys, sometimes anything an i64 can hold.
fn position_i64() -> impl Strategy<Value = i64> {
    prop_oneof![8 => 0i64..40, 1 => any::<i64>(), 1 => Just(i64::MAX), 1 => -3i64..0]
}

fn position_usize() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0usize..20, 1 => any::<usize>(), 1 => Just(usize::MAX)]
}

/// Any block-sparse config, valid or not.
fn config() -> impl Strategy<Value = BlockSparseConfig> {
    (0usize..6, 0usize..5, 0usize..3, 0usize..3).prop_map(
        |(block_size, top_blocks, init_blocks, local_blocks)| BlockSparseConfig {
            block_size,
            top_blocks,
            init_blocks,
            local_blocks,
        },
    )
}

fn config_valid(c: &BlockSparseConfig) -> bool {
    c.block_size > 0 && (c.top_blocks > 0 || c.init_blocks > 0 || c.local_blocks > 0)
}

/// The refusal `config_valid` predicts for an invalid config: `block_size`
/// when it is 0, else `top_blocks` (0, with nothing forced).
fn config_refusal(c: &BlockSparseConfig) -> Option<(&'static str, &'static str)> {
    if c.block_size == 0 {
        Some(("InvalidConfig", "block_size"))
    } else if !config_valid(c) {
        Some(("InvalidConfig", "top_blocks"))
    } else {
        None
    }
}

/// A refused call's variant and argument (`None` for `Ok`): what a property
/// that expects a refusal compares with the one it predicts.
fn refusal<T>(r: &Result<T, ArgumentError>) -> Option<(&'static str, &'static str)> {
    let e = r.as_ref().err()?;
    let variant = match e {
        ArgumentError::Length { .. } => "Length",
        ArgumentError::OutputSize { .. } => "OutputSize",
        ArgumentError::Invalid { .. } => "Invalid",
        ArgumentError::InvalidConfig { .. } => "InvalidConfig",
        ArgumentError::OutOfRange { .. } => "OutOfRange",
        ArgumentError::TooLarge { .. } => "TooLarge",
        ArgumentError::OutputTooLarge { .. } => "OutputTooLarge",
    };
    Some((variant, e.argument()))
}

// ---------------------------------------------------------------------------
// Oracles
// ---------------------------------------------------------------------------

/// One row's witnesses, straight from the rule: slot `s < S_eff` holds
/// `ceil(s·L / S_eff)` when no non-negative learned entry maps to segment
/// `s` (entries are clamped to `S - 1`), else -1.
fn witness_oracle(row: &[i32], len: i32, s: usize) -> Vec<i32> {
    let mut out = vec![-1; s];
    if len <= 0 || s == 0 {
        return out;
    }
    let l = len as u128;
    let s_eff = (s as u128).min(l);
    let mut occupied = vec![false; s];
    for &x in row.iter().filter(|&&x| x >= 0) {
        let seg = ((x as u128) * s_eff / l).min(s as u128 - 1);
        occupied[seg as usize] = true;
    }
    for seg in 0..s_eff as usize {
        if !occupied[seg] {
            out[seg] = ((seg as u128) * l).div_ceil(s_eff) as i32;
        }
    }
    out
}

/// The witness contracts of one row: each witness causal (`< L`), in the
/// segment of its slot, not a learned entry, distinct from the others.
fn check_witness_contracts(
    row: &[i32],
    len: i32,
    s: usize,
    w: &[i32],
) -> Result<(), TestCaseError> {
    let mut seen = std::collections::BTreeSet::new();
    for (slot, &x) in w.iter().enumerate() {
        if x < 0 {
            prop_assert_eq!(x, -1);
            continue;
        }
        prop_assert!(len > 0 && x < len, "witness {} not causal (L = {})", x, len);
        prop_assert_eq!(segment_of(x as usize, len as usize, s), slot);
        prop_assert!(!row.contains(&x), "witness {} is already learned", x);
        prop_assert!(seen.insert(x), "witness {} repeated", x);
    }
    Ok(())
}

/// The dot product of small-integer (or special) data, summed in order:
/// exact, so any summation order agrees with it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One (query, head)'s selection by the rule, from exact scores.
fn block_oracle(
    q: &[f32],
    k: &[f32],
    d: usize,
    n_positions: usize,
    query_pos: usize,
    cfg: &BlockSparseConfig,
) -> Vec<i32> {
    let bs = cfg.block_size;
    let vis = query_pos.saturating_add(1).min(n_positions);
    let n_blocks = vis.div_ceil(bs);
    let score = |b: usize| {
        let mut best = f32::NEG_INFINITY;
        for p in b * bs..((b + 1) * bs).min(vis) {
            let s = dot(q, &k[p * d..(p + 1) * d]);
            if !s.is_nan() && s > best {
                best = s;
            }
        }
        best + 0.0
    };
    let init_end = cfg.init_blocks.min(n_blocks);
    let local_start = (n_blocks - cfg.local_blocks.min(n_blocks)).max(init_end);
    let forced = init_end + (n_blocks - local_start);
    let want = (cfg.top_blocks.max(forced) - forced).min(local_start - init_end);
    let mut free: Vec<(f32, usize)> = (init_end..local_start).map(|b| (score(b), b)).collect();
    free.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut sel: Vec<usize> = (0..init_end).chain(local_start..n_blocks).collect();
    sel.extend(free.iter().take(want).map(|&(_, b)| b));
    sel.sort_unstable();
    let mut row: Vec<i32> = sel.iter().map(|&b| b as i32).collect();
    row.resize(cfg.width(), -1);
    row
}

/// The contracts of one selection row: ascending block ids then -1
/// padding, every block causal and allocated, the forced blocks present,
/// never empty when the query sees a key, within the row's width.
fn check_selection_row(
    row: &[i32],
    n_positions: usize,
    query_pos: usize,
    cfg: &BlockSparseConfig,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(row.len(), cfg.width());
    let n = row.iter().take_while(|&&b| b >= 0).count();
    prop_assert!(
        row[n..].iter().all(|&b| b == -1),
        "padding not -1: {:?}",
        row
    );
    let sel = &row[..n];
    prop_assert!(
        sel.windows(2).all(|w| w[0] < w[1]),
        "not ascending: {:?}",
        row
    );
    let vis = query_pos.saturating_add(1).min(n_positions);
    let n_blocks = vis.div_ceil(cfg.block_size);
    for &b in sel {
        prop_assert!((b as usize) < n_blocks, "block {} not causal", b);
    }
    if n_blocks > 0 {
        prop_assert!(n >= 1, "empty selection for a query that sees a key");
        prop_assert!(n >= cfg.top_blocks.min(n_blocks));
        for b in (0..cfg.init_blocks.min(n_blocks))
            .chain(n_blocks - cfg.local_blocks.min(n_blocks)..n_blocks)
        {
            prop_assert!(sel.contains(&(b as i32)), "forced block {} missing", b);
        }
    } else {
        prop_assert_eq!(n, 0);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Witnesses
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct WitnessCase {
    topk: usize,
    learned: Vec<i32>,
    lens: Vec<i32>,
    s: usize,
    keep: usize,
    max_replacements: usize,
}

fn witness_case() -> impl Strategy<Value = WitnessCase> {
    (0usize..6, 0usize..12, skew())
        .prop_flat_map(|(rows, topk, sk)| {
            (
                Just(topk),
                prop::collection::vec(entry(), skewed(rows * topk, sk)),
                prop::collection::vec(context_len(), rows),
                prop_oneof![8 => 1usize..=MAX_TOPOLOGY_SEGMENTS, 1 => Just(0usize), 1 => 65usize..80],
                prop_oneof![4 => 0..=topk, 1 => topk + 1..topk + 3],
                prop_oneof![4 => 0..=topk + 1, 1 => Just(usize::MAX)],
            )
        })
        .prop_map(
            |(topk, learned, lens, s, keep, max_replacements)| WitnessCase {
                topk,
                learned,
                lens,
                s,
                keep,
                max_replacements,
            },
        )
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn segment_of_never_panics_and_is_the_exact_quotient(
        token in position_usize(), len in position_usize(), s in position_usize()
    ) {
        // σ itself, never clamped: floor(token · S_eff / L) in exact
        // arithmetic, at most the token, and inside the partition for an
        // in-range token.
        let seg = segment_of(token, len, s);
        let l = len.max(1) as u128;
        let s_eff = (s as u128).min(l);
        prop_assert_eq!(seg as u128, token as u128 * s_eff / l);
        prop_assert!(seg <= token);
        if s >= 1 && token < len {
            prop_assert!(seg < s.min(len));
        }
    }
}

proptest! {
    #![proptest_config(cases(1500))]

    #[test]
    fn witness_indices_equal_the_rule_and_keep_their_contracts(c in witness_case()) {
        let rows = c.lens.len();
        let ok = c.s >= 1 && c.learned.len() == c.topk * rows;
        let mut out = vec![SENTINEL; rows * c.s];
        let r = witness::topology_witness_indices_into(&c.learned, c.topk, &c.lens, c.s, &mut out);
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        let alloc = witness::topology_witness_indices(&c.learned, c.topk, &c.lens, c.s);
        prop_assert_eq!(alloc.is_ok(), ok);
        if !ok {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
            return Ok(());
        }
        prop_assert_eq!(&alloc.unwrap(), &out);
        for r in 0..rows {
            let row = &c.learned[r * c.topk..(r + 1) * c.topk];
            let w = &out[r * c.s..(r + 1) * c.s];
            prop_assert_eq!(w, &witness_oracle(row, c.lens[r], c.s)[..]);
            check_witness_contracts(row, c.lens[r], c.s, w)?;
        }
    }

    #[test]
    fn apply_keeps_the_prefix_and_writes_witnesses_within_budget(c in witness_case()) {
        let rows = c.lens.len();
        let ok = c.learned.len() == c.topk * rows
            && (1..=MAX_TOPOLOGY_SEGMENTS).contains(&c.s)
            && c.keep <= c.topk;
        let mut out = vec![SENTINEL; c.learned.len()];
        let r = witness::apply_topology_witnesses_into(
            &c.learned, c.topk, &c.lens, c.keep, c.s, c.max_replacements, &mut out,
        );
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        let alloc = witness::apply_topology_witnesses(
            &c.learned, c.topk, &c.lens, c.keep, c.s, c.max_replacements,
        );
        prop_assert_eq!(alloc.is_ok(), ok);
        if !ok {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
            return Ok(());
        }
        prop_assert_eq!(&alloc.unwrap(), &out);
        let budget = c.max_replacements.min(c.topk - c.keep);
        for r in 0..rows {
            let row = &c.learned[r * c.topk..(r + 1) * c.topk];
            let merged = &out[r * c.topk..(r + 1) * c.topk];
            // The prefix is kept bit for bit, and so is everything past the budget.
            prop_assert_eq!(&merged[..c.keep], &row[..c.keep]);
            prop_assert_eq!(&merged[c.keep + budget..], &row[c.keep + budget..]);
            // The first witnesses, in ascending segment order, fill the budget.
            let w: Vec<i32> = witness_oracle(row, c.lens[r], c.s)
                .into_iter()
                .filter(|&x| x >= 0)
                .collect();
            let m = w.len().min(budget);
            prop_assert_eq!(&merged[c.keep..c.keep + m], &w[..m]);
            prop_assert_eq!(&merged[c.keep + m..], &row[c.keep + m..]);
            let changed = merged.iter().zip(row).filter(|(a, b)| a != b).count();
            prop_assert!(changed <= budget);
            for &x in &w[..m] {
                prop_assert!(x < c.lens[r], "witness not causal");
            }
        }
    }

    #[test]
    fn scatter_is_apply_in_place_and_untouched_when_refused(c in witness_case()) {
        let mut buf = c.learned.clone();
        let r = witness::scatter_topology_witnesses(&mut buf, c.topk, &c.lens, c.s);
        if c.s == 0 {
            prop_assert!(r.is_ok());
            prop_assert_eq!(&buf, &c.learned);
            return Ok(());
        }
        let keep = c.topk.saturating_sub(c.s);
        let applied =
            witness::apply_topology_witnesses(&c.learned, c.topk, &c.lens, keep, c.s, c.s);
        prop_assert_eq!(r.is_ok(), applied.is_ok(), "{:?} vs {:?}", r, applied);
        match applied {
            Ok(a) => prop_assert_eq!(buf, a),
            Err(_) => prop_assert_eq!(&buf, &c.learned, "refused scatter wrote its buffer"),
        }
    }

    #[test]
    fn nulls_are_causal_distinct_ascending_and_spend_the_budget(
        len in prop_oneof![8 => 0usize..3000, 1 => Just(0usize)],
        budget in prop_oneof![8 => 0usize..3000, 1 => any::<usize>()],
        seed in any::<u64>(),
    ) {
        let k = budget.min(len);
        let r = witness::random_null(len, budget, seed);
        prop_assert_eq!(r.len(), k);
        prop_assert!(r.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(r.iter().all(|&x| x >= 0 && (x as usize) < len));
        prop_assert_eq!(&r, &witness::random_null(len, budget, seed));
        let l = witness::locality_null(len, budget);
        let want: Vec<i32> = ((len - k) as i32..len as i32).collect();
        prop_assert_eq!(l, want);
    }

    #[test]
    fn coverage_and_recall_take_any_input(
        cand in prop::collection::vec(entry(), 0..20),
        len in position_usize(),
        s in position_usize(),
        row in prop::collection::vec(
            prop_oneof![6 => 0.0f64..1.0, 1 => Just(f64::NAN), 1 => Just(f64::INFINITY),
                        1 => Just(-1.0f64), 1 => Just(0.0f64)],
            0..30,
        ),
    ) {
        let cov = witness::segment_coverage(&cand, len, s);
        let s_eff = s.min(len);
        if s_eff == 0 {
            prop_assert_eq!(cov, 1.0);
        } else {
            let mut hit: Vec<usize> = cand
                .iter()
                .filter(|&&x| x >= 0 && (x as usize) < len)
                .map(|&x| segment_of(x as usize, len, s))
                .collect();
            hit.sort_unstable();
            hit.dedup();
            prop_assert_eq!(cov, hit.len() as f64 / s_eff as f64);
            prop_assert!((0.0..=1.0).contains(&cov));
        }
        let recall = witness::attention_mass_recall(&cand, &row);
        if row.iter().all(|&a| (0.0..1.0).contains(&a)) && row.iter().any(|&a| a > 0.0) {
            prop_assert!((0.0..=1.0 + 1e-12).contains(&recall), "recall {}", recall);
        }
    }
}

// ---------------------------------------------------------------------------
// Block-sparse selection
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct BlockCase {
    cfg: BlockSparseConfig,
    n_queries: usize,
    n_kv_heads: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    pos: Vec<i64>,
    out_len: usize,
}

fn block_case(float: BoxedStrategy<f32>) -> impl Strategy<Value = BlockCase> {
    (
        config(),
        0usize..4,
        0usize..4,
        prop_oneof![8 => 1usize..5, 1 => Just(0usize)],
        0usize..24,
        (skew(), skew(), skew(), skew()),
    )
        .prop_flat_map(move |(cfg, nq, h, d, np, (sq, sk, sp, so))| {
            (
                Just((cfg, nq, h, d)),
                prop::collection::vec(float.clone(), skewed(nq * h * d, sq)),
                prop::collection::vec(float.clone(), skewed(np * d, sk)),
                prop::collection::vec(position_i64(), skewed(nq, sp)),
                Just(skewed(nq * h * cfg.width(), so)),
            )
        })
        .prop_map(
            |((cfg, n_queries, n_kv_heads, d), q, k, pos, out_len)| BlockCase {
                cfg,
                n_queries,
                n_kv_heads,
                d,
                q,
                k,
                pos,
                out_len,
            },
        )
}

impl BlockCase {
    fn valid(&self) -> bool {
        config_valid(&self.cfg)
            && self.d > 0
            && self.k.len().is_multiple_of(self.d)
            && self.q.len() == self.n_queries * self.n_kv_heads * self.d
            && self.pos.len() == self.n_queries
            && self.pos.iter().all(|&p| p >= 0)
            && self.out_len == self.n_queries * self.n_kv_heads * self.cfg.width()
    }

    /// The refusal an invalid case gets: its first fault in the order the
    /// entry point checks them (config, d, keys, queries, positions, out).
    fn refusal(&self) -> Option<(&'static str, &'static str)> {
        if let Some(r) = config_refusal(&self.cfg) {
            return Some(r);
        }
        if self.d == 0 {
            Some(("Invalid", "d"))
        } else if !self.k.len().is_multiple_of(self.d) {
            Some(("Invalid", "index_k"))
        } else if self.q.len() != self.n_queries * self.n_kv_heads * self.d {
            Some(("Invalid", "index_q"))
        } else if self.pos.len() != self.n_queries {
            Some(("Invalid", "query_pos"))
        } else if self.pos.iter().any(|&p| p < 0) {
            Some(("OutOfRange", "query_pos"))
        } else if self.out_len != self.n_queries * self.n_kv_heads * self.cfg.width() {
            Some(("OutputSize", "out"))
        } else {
            None
        }
    }

    fn run(&self) -> (Result<(), ArgumentError>, Vec<i32>) {
        let mut out = vec![SENTINEL; self.out_len];
        let r = select_batch_into(
            &self.q,
            self.n_queries,
            self.n_kv_heads,
            &self.k,
            self.d,
            &self.pos,
            &self.cfg,
            &mut out,
        );
        (r, out)
    }
}

proptest! {
    #![proptest_config(cases(1500))]

    #[test]
    fn config_new_refuses_exactly_the_configs_that_select_nothing(cfg in config()) {
        let built = BlockSparseConfig::new(
            cfg.block_size, cfg.top_blocks, cfg.init_blocks, cfg.local_blocks,
        );
        prop_assert_eq!(built.is_ok(), config_valid(&cfg));
        prop_assert_eq!(cfg.validate().is_ok(), config_valid(&cfg));
    }

    #[test]
    fn selection_of_exact_data_equals_the_rule(c in block_case(special_float().boxed())) {
        let (r, out) = c.run();
        prop_assert_eq!(r.is_ok(), c.valid(), "{:?}", r);
        prop_assert_eq!(refusal(&r), c.refusal(), "{:?}", r);
        if r.is_err() {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
            return Ok(());
        }
        let np = c.k.len() / c.d;
        let w = c.cfg.width();
        for i in 0..c.n_queries {
            let pos = c.pos[i] as usize;
            for h in 0..c.n_kv_heads {
                let o = (i * c.n_kv_heads + h) * w;
                let row = &out[o..o + w];
                check_selection_row(row, np, pos, &c.cfg)?;
                let q = &c.q[o / w * c.d..(o / w + 1) * c.d];
                prop_assert_eq!(row, &block_oracle(q, &c.k, c.d, np, pos, &c.cfg)[..]);
            }
        }
    }

    #[test]
    fn selection_of_wild_data_keeps_its_contracts(c in block_case(wild_float().boxed())) {
        let (r, out) = c.run();
        prop_assert_eq!(r.is_ok(), c.valid(), "{:?}", r);
        prop_assert_eq!(refusal(&r), c.refusal(), "{:?}", r);
        if r.is_err() {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
            return Ok(());
        }
        let np = c.k.len() / c.d;
        let w = c.cfg.width();
        for i in 0..c.n_queries {
            let pos = c.pos[i] as usize;
            let rows = &out[i * c.n_kv_heads * w..(i + 1) * c.n_kv_heads * w];
            for row in rows.chunks(w.max(1)) {
                check_selection_row(row, np, pos, &c.cfg)?;
            }
            // Row for row equal to the one-query entry points.
            let qi = &c.q[i * c.n_kv_heads * c.d..(i + 1) * c.n_kv_heads * c.d];
            let mut one = vec![SENTINEL; c.n_kv_heads * w];
            select_into(qi, c.n_kv_heads, &c.k, c.d, pos, &c.cfg, &mut one).unwrap();
            prop_assert_eq!(&one[..], rows);
            let nested = block_sparse_select(qi, c.n_kv_heads, &c.k, c.d, pos, &c.cfg).unwrap();
            for (h, sel) in nested.iter().enumerate() {
                let n = rows[h * w..(h + 1) * w].iter().take_while(|&&b| b >= 0).count();
                let got: Vec<usize> =
                    rows[h * w..h * w + n].iter().map(|&b| b as usize).collect();
                prop_assert_eq!(sel, &got);
            }
        }
        // Deterministic: a second call gives the same bytes.
        prop_assert_eq!(c.run().1, out);
    }

    #[test]
    fn packed_selection_equals_per_sequence_calls(
        cfg in config(),
        h in 0usize..3,
        d in prop_oneof![6 => 1usize..4, 1 => Just(0usize)],
        seq_lens in prop::collection::vec(0usize..12, 0..4),
        corrupt_cu in prop::option::weighted(0.1, (0usize..5, any::<i64>())),
        queries in prop::collection::vec((prop_oneof![8 => 0i64..4, 1 => any::<i64>()], position_i64()), 0..5),
        seed in any::<u64>(),
    ) {
        let np: usize = seq_lens.iter().sum();
        let mut cu: Vec<i64> = std::iter::once(0)
            .chain(seq_lens.iter().scan(0i64, |a, &l| { *a += l as i64; Some(*a) }))
            .collect();
        if let Some((i, v)) = corrupt_cu {
            if i < cu.len() { cu[i] = v; }
        }
        // Small-integer data from the seed (exact, so per-sequence calls agree).
        let mut x = seed | 1;
        let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ((x % 9) as i32 - 4) as f32 };
        let n_queries = queries.len();
        let q: Vec<f32> = (0..n_queries * h * d).map(|_| next()).collect();
        let k: Vec<f32> = (0..np * d).map(|_| next()).collect();
        let sids: Vec<i64> = queries.iter().map(|p| p.0).collect();
        let pos: Vec<i64> = queries.iter().map(|p| p.1).collect();
        let w = cfg.width();
        let mut out = vec![SENTINEL; n_queries * h * w];
        let r = select_packed_into(&q, n_queries, h, &k, d, &cu, &sids, &pos, &cfg, &mut out);
        let cu_ok = cu.first() == Some(&0)
            && cu.windows(2).all(|w| w[0] <= w[1])
            && *cu.last().unwrap() == np as i64;
        let ok = config_valid(&cfg) && d > 0 && cu_ok
            && sids.iter().all(|&s| s >= 0 && (s as usize) < seq_lens.len())
            && pos.iter().all(|&p| p >= 0);
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        if !ok {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
            return Ok(());
        }
        for i in 0..n_queries {
            let s = sids[i] as usize;
            let (k0, k1) = (cu[s] as usize, cu[s + 1] as usize);
            let mut one = vec![SENTINEL; h * w];
            select_into(&q[i * h * d..(i + 1) * h * d], h, &k[k0 * d..k1 * d], d,
                        pos[i] as usize, &cfg, &mut one).unwrap();
            prop_assert_eq!(&out[i * h * w..(i + 1) * h * w], &one[..]);
        }
    }

    #[test]
    fn positions_of_blocks_are_the_covered_causal_positions(
        cfg in config(),
        blocks in prop::collection::vec(
            prop_oneof![8 => -2i32..12, 1 => any::<i32>(), 1 => Just(i32::MAX)], 0..8),
        query_pos in prop_oneof![6 => 0usize..60, 1 => any::<usize>()],
        n_positions in prop_oneof![6 => 0usize..60, 1 => any::<usize>()],
    ) {
        let r = positions_of_blocks_i32(&blocks, query_pos, n_positions, &cfg);
        if !config_valid(&cfg) {
            prop_assert_eq!(refusal(&r), config_refusal(&cfg), "{:?}", r);
            return Ok(());
        }
        let bs = cfg.block_size as u128;
        let limit = (query_pos as u128 + 1).min(n_positions as u128);
        let mut want: Vec<u128> = Vec::new();
        for &b in blocks.iter().filter(|&&b| b >= 0) {
            let start = b as u128 * bs;
            want.extend(start..((b as u128 + 1) * bs).min(limit).max(start));
        }
        want.sort_unstable();
        want.dedup();
        let fits = want.last().is_none_or(|&p| p <= i32::MAX as u128);
        prop_assert_eq!(r.is_ok(), fits, "{:?}", r.as_ref().err());
        let usize_blocks: Vec<usize> =
            blocks.iter().filter(|&&b| b >= 0).map(|&b| b as usize).collect();
        let wide = positions_of_blocks(&usize_blocks, query_pos, n_positions, &cfg);
        prop_assert_eq!(wide.iter().map(|&p| p as u128).collect::<Vec<_>>(), want.clone());
        if let Ok(got) = r {
            prop_assert_eq!(got.iter().map(|&p| p as u128).collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn positions_of_huge_block_ids_never_overflow(
        cfg in config().prop_filter("valid", config_valid),
        blocks in prop::collection::vec(any::<usize>(), 0..6),
        query_pos in any::<usize>(),
    ) {
        let got = positions_of_blocks(&blocks, query_pos, usize::MAX, &cfg);
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(got.iter().all(|&p| p <= query_pos));
        prop_assert!(got.len() <= blocks.len() * cfg.block_size);
    }
}

// ---------------------------------------------------------------------------
// Selectors and the oracle
// ---------------------------------------------------------------------------

fn selector() -> impl Strategy<Value = Selector> {
    let n = || prop_oneof![6 => 0usize..12, 1 => any::<usize>()];
    prop_oneof![
        Just(Selector::Dense),
        n().prop_map(|window| Selector::Local { window }),
        (n(), any::<u64>()).prop_map(|(budget, seed)| Selector::Random { budget, seed }),
        (n(), n()).prop_map(|(sinks, window)| Selector::SinkWindow { sinks, window }),
    ]
}

proptest! {
    #![proptest_config(cases(1500))]

    #[test]
    fn selector_rows_are_causal_distinct_and_fit_their_width(
        sel in selector(),
        rows in prop::collection::vec(
            prop_oneof![8 => 0usize..30, 1 => Just(i32::MAX as usize), 1 => any::<usize>()], 0..5),
        width in prop_oneof![4 => 0usize..32, 1 => Just(usize::MAX)],
        h in 0usize..3,
    ) {
        let mut out = vec![SENTINEL; rows.len().saturating_mul(width).min(1 << 12)];
        let r = sel.rows_into(&rows, width, &mut out);
        let fits = rows.iter().all(|&p| p < i32::MAX as usize && sel.row_len(p) <= width)
            && rows.len().checked_mul(width) == Some(out.len());
        prop_assert_eq!(r.is_ok(), fits, "{:?}", r);
        // Which refusal: out's size first, then the first row past i32 or
        // wider than `width`.
        let want = match rows.len().checked_mul(width) {
            None => Some(("TooLarge", "out")),
            Some(n) if n != out.len() => Some(("Length", "out")),
            Some(_) => rows.iter().find_map(|&p| {
                if p >= i32::MAX as usize {
                    Some(("OutOfRange", "rows"))
                } else if sel.row_len(p) > width {
                    Some(("Invalid", "width"))
                } else {
                    None
                }
            }),
        };
        prop_assert_eq!(refusal(&r), want, "{:?}", r);
        if r.is_err() {
            prop_assert!(out.iter().all(|&x| x == SENTINEL), "refused call wrote out");
        }
        for (i, &p) in rows.iter().enumerate() {
            if p > 100 {
                continue; // a Dense row that long is too big to materialise here
            }
            let row = sel.row(p);
            prop_assert_eq!(row.len(), sel.row_len(p));
            prop_assert!(row.windows(2).all(|w| w[0] < w[1]), "not distinct ascending");
            prop_assert!(row.iter().all(|&x| x >= 0 && x as usize <= p), "not causal");
            if let Selector::Dense = sel { prop_assert_eq!(row.len(), p + 1); }
            if r.is_ok() {
                let o = &out[i * width..(i + 1) * width];
                prop_assert_eq!(&o[..row.len()], &row[..]);
                prop_assert!(o[row.len()..].iter().all(|&x| x == -1));
            }
        }
        if r.is_ok() {
            let mut wide = vec![SENTINEL; rows.len() * h * width];
            sel.selection_into(&rows, h, width, &mut wide).unwrap();
            for (i, chunk) in wide.chunks(width.max(1)).enumerate() {
                let r = i / h.max(1);
                prop_assert_eq!(chunk, &out[r * width..(r + 1) * width]);
            }
        }
    }

    #[test]
    fn oracle_topk_takes_the_heaviest_keys_ties_to_the_lower(
        row in prop::collection::vec(
            prop_oneof![6 => (0i32..5).prop_map(|x| x as f64 / 4.0), 1 => Just(f64::NAN),
                        1 => Just(f64::INFINITY), 1 => Just(f64::NEG_INFINITY),
                        1 => Just(-0.0f64), 1 => any::<f64>()],
            0..24),
        budget in prop_oneof![6 => 0usize..30, 1 => any::<usize>()],
        query_row in position_usize(),
    ) {
        let got = oracle_topk_row(&row, budget);
        prop_assert_eq!(got.len(), budget.min(row.len()));
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]));
        let key = |j: usize| if row[j].is_nan() { f64::NEG_INFINITY } else { row[j] + 0.0 };
        for &c in &got {
            for u in (0..row.len()).filter(|u| !got.contains(&(*u as i32))) {
                let (kc, ku) = (key(c as usize), key(u));
                prop_assert!(kc > ku || (kc == ku && (c as usize) < u),
                    "chose {} ({}) over {} ({})", c, row[c as usize], u, row[u]);
            }
        }
        // The causal form only sees keys 0..=query_row.
        let oracle = OracleTopK { budget };
        let causal = oracle.row(query_row, &row);
        let vis = query_row.saturating_add(1).min(row.len());
        prop_assert_eq!(&causal, &oracle_topk_row(&row[..vis], budget));
        prop_assert_eq!(causal.len(), oracle.row_len(query_row, row.len()));
        let w = causal.len() + 1;
        let mut out = vec![SENTINEL; w];
        oracle.rows_into(&row, row.len(), &[query_row], w, &mut out).unwrap();
        prop_assert_eq!(&out[..causal.len()], &causal[..]);
        prop_assert_eq!(out[causal.len()], -1);
    }
}

// ---------------------------------------------------------------------------
// Attention and metrics
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct AttnCase {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    v_stride: usize,
    pos: Vec<usize>,
    sel: Vec<i32>,
    width: usize,
    scale: f32,
    out_len: usize,
    lse_len: usize,
}

fn attn_float() -> impl Strategy<Value = f32> {
    prop_oneof![30 => -2.0f32..2.0, 1 => Just(f32::NAN), 1 => Just(f32::INFINITY)]
}

fn attn_case() -> impl Strategy<Value = AttnCase> {
    (
        (0usize..4, 0usize..3, 1usize..3, 0usize..2),
        (0usize..5, 0usize..5, 0usize..10, 0usize..3, 0usize..5),
        (skew(), skew(), skew(), skew(), skew(), skew(), skew()),
        prop_oneof![8 => 0.05f32..1.5, 1 => Just(f32::NAN), 1 => Just(f32::INFINITY)],
    )
        .prop_flat_map(
            |((nq, hkv, g, odd), (dk, dv, nk, extra_stride, width), sk, scale)| {
                let hq = hkv * g + odd;
                let v_stride = dv + extra_stride;
                let v_need = (nk * hkv).checked_sub(1).map_or(0, |l| l * v_stride + dv);
                let shape = AttentionShape {
                    n_queries: nq,
                    n_q_heads: hq,
                    n_kv_heads: hkv,
                    d_k: dk,
                    d_v: dv,
                    n_keys: nk,
                };
                (
                    Just((shape, v_stride, width, scale)),
                    prop::collection::vec(attn_float(), skewed(nq * hq * dk, sk.0)),
                    prop::collection::vec(attn_float(), skewed(nk * hkv * dk, sk.1)),
                    prop::collection::vec(attn_float(), skewed(v_need, sk.2)),
                    prop::collection::vec(position_usize(), skewed(nq, sk.3)),
                    prop::collection::vec(
                        prop_oneof![8 => -2i32..12, 1 => any::<i32>()],
                        skewed(nq * hkv * width, sk.4),
                    ),
                    Just((skewed(nq * hq * dv, sk.5), skewed(nq * hq, sk.6))),
                )
            },
        )
        .prop_map(
            |((shape, v_stride, width, scale), q, k, v, pos, sel, (out_len, lse_len))| AttnCase {
                shape,
                q,
                k,
                v,
                v_stride,
                pos,
                sel,
                width,
                scale,
                out_len,
                lse_len,
            },
        )
}

impl AttnCase {
    fn pass_valid(&self) -> bool {
        let s = &self.shape;
        let v_need = (s.n_keys * s.n_kv_heads)
            .checked_sub(1)
            .map_or(0, |l| l * self.v_stride + s.d_v);
        s.n_kv_heads > 0
            && s.n_q_heads.is_multiple_of(s.n_kv_heads)
            && self.q.len() == s.n_queries * s.n_q_heads * s.d_k
            && self.k.len() == s.n_keys * s.n_kv_heads * s.d_k
            && self.v.len() >= v_need
            && self.pos.len() == s.n_queries
            && self.scale.is_finite()
            && self.out_len == s.n_queries * s.n_q_heads * s.d_v
            && self.lse_len == s.n_queries * s.n_q_heads
    }

    fn finite(&self) -> bool {
        [&self.q, &self.k, &self.v]
            .iter()
            .all(|b| b.iter().all(|x| x.is_finite()))
    }
}

proptest! {
    #![proptest_config(cases(1500))]

    #[test]
    fn sparse_attention_is_a_convex_combination_of_the_selected_values(c in attn_case()) {
        let s = c.shape;
        let mut out = vec![f32::from_bits(SENTINEL as u32); c.out_len];
        let mut lse = vec![f32::from_bits(SENTINEL as u32); c.lse_len];
        let r = sparse_attention(&c.q, &c.k, &c.v, c.v_stride, &s, &c.pos, &c.sel, c.width,
                                 c.scale, &mut out, &mut lse);
        let ok = c.pass_valid() && c.sel.len() == s.n_queries * s.n_kv_heads * c.width;
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        let Ok(empty) = r else {
            prop_assert!(out.iter().chain(&lse).all(|x| x.to_bits() == SENTINEL as u32),
                "refused call wrote out/lse");
            return Ok(());
        };
        let g = s.group();
        let mut want_empty = 0;
        for i in 0..s.n_queries {
            let vis = c.pos[i].saturating_add(1).min(s.n_keys);
            for hq in 0..s.n_q_heads {
                let h = hq / g;
                let row = &c.sel[(i * s.n_kv_heads + h) * c.width..][..c.width];
                let mut keys: Vec<usize> = row.iter()
                    .filter(|&&x| x >= 0 && (x as usize) < vis).map(|&x| x as usize).collect();
                keys.sort_unstable();
                keys.dedup();
                let o = &out[(i * s.n_q_heads + hq) * s.d_v..][..s.d_v];
                let l = lse[i * s.n_q_heads + hq];
                if keys.is_empty() {
                    want_empty += 1;
                    prop_assert_eq!(l, f32::NEG_INFINITY);
                    prop_assert!(o.iter().all(|&x| x == 0.0));
                    continue;
                }
                if !c.finite() {
                    continue;
                }
                prop_assert!(l.is_finite(), "lse {} for a row with keys", l);
                // An f64 reference of the same softmax.
                let qv = &c.q[(i * s.n_q_heads + hq) * s.d_k..][..s.d_k];
                let logits: Vec<f64> = keys.iter().map(|&j| {
                    let kv = &c.k[(j * s.n_kv_heads + h) * s.d_k..][..s.d_k];
                    qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                        * c.scale as f64
                }).collect();
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|x| (x - m).exp()).sum();
                prop_assert!(((m + z.ln()) - l as f64).abs() < 1e-4, "lse {} vs {}", l, m + z.ln());
                for (e, &got) in o.iter().enumerate() {
                    let got = got as f64;
                    let vals: Vec<f64> = keys.iter()
                        .map(|&j| c.v[(j * s.n_kv_heads + h) * c.v_stride + e] as f64).collect();
                    let want: f64 = vals.iter().zip(&logits)
                        .map(|(v, x)| v * (x - m).exp() / z).sum();
                    prop_assert!((got - want).abs() < 1e-4, "out {} vs {}", got, want);
                    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
                    let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    prop_assert!(got >= lo - 1e-5 && got <= hi + 1e-5);
                }
            }
        }
        prop_assert_eq!(empty, want_empty);
    }

    #[test]
    fn dense_attention_is_sparse_attention_over_every_causal_key(c in attn_case()) {
        let s = c.shape;
        let mut out = vec![0.0f32; c.out_len];
        let mut lse = vec![0.0f32; c.lse_len];
        let r = dense_attention(&c.q, &c.k, &c.v, c.v_stride, &s, &c.pos, c.scale,
                                &mut out, &mut lse);
        prop_assert_eq!(r.is_ok(), c.pass_valid(), "{:?}", r);
        let Ok(empty) = r else { return Ok(()) };
        prop_assert_eq!(empty, if s.n_keys == 0 { s.n_queries * s.n_q_heads } else { 0 });
        let w = s.n_keys;
        let full: Vec<i32> = (0..s.n_queries * s.n_kv_heads)
            .flat_map(|_| 0..w as i32).collect();
        let mut out2 = vec![0.0f32; c.out_len];
        let mut lse2 = vec![0.0f32; c.lse_len];
        let e2 = sparse_attention(&c.q, &c.k, &c.v, c.v_stride, &s, &c.pos, &full, w,
                                  c.scale, &mut out2, &mut lse2).unwrap();
        prop_assert_eq!(empty, e2);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&out), bits(&out2));
        prop_assert_eq!(bits(&lse), bits(&lse2));
        // MLA: one latent KV head read in place is the same pass.
        if s.n_kv_heads == 1 && s.d_v <= s.d_k && s.d_k > 0 && c.finite() {
            let mut o3 = vec![0.0f32; c.out_len];
            let mut l3 = vec![0.0f32; c.lse_len];
            let e3 = causal_mla_attention_sparse(&c.q, &c.k, s.n_q_heads, s.d_k, s.d_v, &c.pos,
                                                 &full, w, c.scale, &mut o3, &mut l3).unwrap();
            let mut o4 = vec![0.0f32; c.out_len];
            let mut l4 = vec![0.0f32; c.lse_len];
            let e4 = sparse_attention(&c.q, &c.k, &c.k, s.d_k, &s, &c.pos, &full, w, c.scale,
                                      &mut o4, &mut l4).unwrap();
            prop_assert_eq!(e3, e4);
            prop_assert_eq!(bits(&o3), bits(&o4));
            prop_assert_eq!(bits(&l3), bits(&l4));
        }
    }

    #[test]
    fn attention_probabilities_are_causal_softmax_rows(c in attn_case()) {
        let s = c.shape;
        let mut probs = vec![f64::NAN; s.n_queries * s.n_q_heads * s.n_keys];
        let r = metrics::attention_probabilities(&c.q, &c.k, &s, &c.pos, c.scale as f64,
                                                 &mut probs);
        let ok = s.n_kv_heads > 0 && s.n_q_heads % s.n_kv_heads == 0
            && c.q.len() == s.n_queries * s.n_q_heads * s.d_k
            && c.k.len() == s.n_keys * s.n_kv_heads * s.d_k
            && c.pos.len() == s.n_queries && c.scale.is_finite();
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        if !ok || !c.finite() || s.n_keys == 0 {
            return Ok(());
        }
        for i in 0..s.n_queries {
            let vis = c.pos[i].saturating_add(1).min(s.n_keys);
            for h in 0..s.n_q_heads {
                let row = &probs[(i * s.n_q_heads + h) * s.n_keys..][..s.n_keys];
                prop_assert!(row[vis..].iter().all(|&p| p == 0.0), "future key has mass");
                prop_assert!(row.iter().all(|&p| (0.0..=1.0).contains(&p)));
                let total: f64 = row.iter().sum();
                prop_assert!((total - 1.0).abs() < 1e-9, "row sums to {}", total);
            }
        }
        // The oracle over these rows is a valid sparse-attention selection.
        let oracle = OracleTopK { budget: 3 };
        let mut sel = vec![SENTINEL; s.n_queries * s.n_kv_heads * 3];
        oracle.selection_into(&probs, &s, &c.pos, 3, &mut sel).unwrap();
        for (r, row) in sel.chunks(3).enumerate() {
            let vis = c.pos[r / s.n_kv_heads.max(1)].saturating_add(1).min(s.n_keys);
            let n = row.iter().take_while(|&&x| x >= 0).count();
            prop_assert_eq!(n, 3.min(vis));
            prop_assert!(row[..n].windows(2).all(|w| w[0] < w[1]));
            prop_assert!(row[..n].iter().all(|&x| (x as usize) < vis));
        }
    }

    #[test]
    fn batched_metrics_equal_their_row_forms(
        (rows, width) in (0usize..5, 0usize..6),
        group in prop_oneof![6 => 1usize..3, 1 => Just(0usize)],
        cand_seed in prop::collection::vec(entry(), 30),
        lens in prop::collection::vec(prop_oneof![4 => 0usize..50, 1 => any::<usize>()], 5),
        s in position_usize(),
        att in prop::collection::vec(0.0f64..1.0, 0..60),
        row_len in 0usize..7,
        dense in prop::collection::vec(wild_float(), 0..20),
    ) {
        let cand: Vec<i32> = cand_seed.iter().cycle().take(rows * width).copied().collect();
        let mut cov = vec![f64::NAN; rows];
        metrics::segment_coverage_rows(&cand, width, &lens[..rows], s, &mut cov).unwrap();
        for r in 0..rows {
            let want = witness::segment_coverage(&cand[r * width..(r + 1) * width], lens[r], s);
            prop_assert_eq!(cov[r].to_bits(), want.to_bits());
        }
        let short = metrics::segment_coverage_rows(&cand, width, &lens[..rows.saturating_sub(1)],
            s, &mut cov);
        prop_assert!(rows == 0 || refusal(&short) == Some(("Length", "context_lens")), "{:?}", short);

        let n_rows = rows * group;
        let att: Vec<f64> = att.iter().cycle().take(n_rows * row_len).copied().collect();
        let mut rec = vec![f64::NAN; n_rows];
        let r = metrics::attention_mass_recall_rows(&cand, width, &att, row_len, group, &mut rec);
        if group == 0 {
            prop_assert_eq!(refusal(&r), Some(("Invalid", "group")), "{:?}", r);
        } else if att.len() == n_rows * row_len {
            prop_assert!(r.is_ok(), "{:?}", r);
            for a in 0..n_rows {
                let c = &cand[a / group * width..(a / group + 1) * width];
                let want = witness::attention_mass_recall(c, &att[a * row_len..(a + 1) * row_len]);
                prop_assert_eq!(rec[a].to_bits(), want.to_bits());
            }
        }

        let n = dense.len();
        let sparse: Vec<f32> = dense.iter().rev().copied().collect();
        let whole = metrics::output_relative_error(&sparse, &dense).unwrap();
        prop_assert!(whole.is_nan() || whole >= 0.0);
        let short = metrics::output_relative_error(&sparse[..n.saturating_sub(1)], &dense);
        prop_assert!(n == 0 || refusal(&short) == Some(("Length", "sparse")), "{:?}", short);
        let w = if n == 0 { 1 } else { (1..=n).rev().find(|w| n % w == 0).unwrap_or(1) };
        let mut per = vec![f64::NAN; n / w];
        metrics::output_relative_error_rows(&sparse, &dense, w, &mut per).unwrap();
        for (r, &e) in per.iter().enumerate() {
            let want = metrics::output_relative_error(&sparse[r * w..(r + 1) * w],
                                                      &dense[r * w..(r + 1) * w]).unwrap();
            prop_assert_eq!(e.to_bits(), want.to_bits());
        }
    }
}
