//! Every level's kernels against the portable ones, bit for bit.

use super::{fold, page_bounds, portable, scores};
use crate::simd::isas_for_test;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Values with the cases that matter: zeros of both signs, NaN, repeats.
fn values(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.random_range(0..12) {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NAN,
            3 => 1.5,
            _ => rng.random_range(-4.0f32..4.0),
        })
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

#[test]
fn fold_is_bit_identical_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for case in 0..400 {
        let n = rng.random_range(0..40);
        let rows: Vec<Vec<f32>> = (0..rng.random_range(1..6))
            .map(|_| values(&mut rng, n))
            .collect();
        let scale = (case % 3 == 0).then(|| rng.random_range(0.01f32..3.0));
        let mut want: Option<(Vec<f32>, Vec<f32>)> = None;
        for isa in isas_for_test() {
            let (mut lo, mut hi) = (vec![7.0f32; n], vec![7.0f32; n]);
            for (i, r) in rows.iter().enumerate() {
                fold(isa, r, scale, i == 0, &mut lo, &mut hi);
            }
            // The bounds hold every non-NaN value, and no -0.0.
            for (j, (&l, &h)) in lo.iter().zip(&hi).enumerate() {
                for r in &rows {
                    let v = portable::canon(r[j], scale);
                    if !v.is_nan() {
                        assert!(l <= v && v <= h, "case {case} dim {j}");
                    }
                }
                assert!(l.to_bits() != (-0.0f32).to_bits() && h.to_bits() != (-0.0f32).to_bits());
            }
            match &want {
                None => want = Some((lo, hi)),
                Some((wl, wh)) => {
                    assert!(
                        same_bits(wl, &lo) && same_bits(wh, &hi),
                        "case {case} at {isa:?}"
                    )
                }
            }
        }
    }
}

#[test]
fn scores_are_bit_identical_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..300 {
        let d = rng.random_range(1..40);
        let g = rng.random_range(1..7);
        let h = rng.random_range(1..4);
        let n_pages = rng.random_range(0..9);
        let stride = h * d + rng.random_range(0..3);
        let q = values(&mut rng, h * g * d);
        let a = values(&mut rng, n_pages * stride);
        let b = values(&mut rng, n_pages * stride);
        let (kmin, kmax): (Vec<f32>, Vec<f32>) = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (x.min(y), x.max(y)))
            .unzip();
        let mut want: Option<Vec<f32>> = None;
        for isa in isas_for_test() {
            let mut out = vec![0.0f32; h * g * n_pages];
            scores(isa, &q, (h, g, d), &kmin, &kmax, stride, n_pages, &mut out);
            match &want {
                None => want = Some(out),
                Some(w) => assert!(same_bits(w, &out), "case {case} at {isa:?}"),
            }
        }
    }
}

#[test]
fn a_dot_is_the_sign_selected_bound_sum() {
    // q = (1, -2, 0, -0): picks max, min, max, max (-0.0 >= 0).
    let q = [1.0f32, -2.0, 0.0, -0.0];
    let kmin = [-1.0f32, -3.0, -5.0, -7.0];
    let kmax = [2.0f32, 4.0, 6.0, 8.0];
    for isa in isas_for_test() {
        let mut out = [0.0f32];
        scores(isa, &q, (1, 1, 4), &kmin, &kmax, 4, 1, &mut out);
        // 1·2 + (-2)·(-3) + 0·6 + (-0)·8
        assert_eq!(out[0], 8.0, "{isa:?}");
    }
}

#[test]
fn a_page_build_is_the_fold_of_its_rows_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for case in 0..400 {
        let n = rng.random_range(1..40);
        let t = rng.random_range(1..20);
        let rows = values(&mut rng, n * t);
        let scales: Option<Vec<f32>> =
            (case % 3 == 0).then(|| (0..t).map(|_| rng.random_range(0.01f32..3.0)).collect());
        let (mut flo, mut fhi) = (vec![0.0f32; n], vec![0.0f32; n]);
        for (i, r) in rows.chunks_exact(n).enumerate() {
            let c = scales.as_ref().map(|s| s[i]);
            fold(crate::simd::Isa::Scalar, r, c, i == 0, &mut flo, &mut fhi);
        }
        // The next page's bytes as the kernel is handed them: none, a whole
        // page, or a short piece starting off a line (a hint either way).
        let bytes: &[u8] = bytemuck::cast_slice(&rows);
        let next = match case % 3 {
            0 => &[][..],
            1 => bytes,
            _ => &bytes[(bytes.len() / 2).min(3)..bytes.len() / 2],
        };
        for isa in isas_for_test() {
            let (mut lo, mut hi) = (vec![7.0f32; n], vec![7.0f32; n]);
            page_bounds(
                isa,
                crate::keys::Encoded::F32(&rows),
                scales.as_deref(),
                &mut lo,
                &mut hi,
                next,
            );
            assert!(
                same_bits(&lo, &flo) && same_bits(&hi, &fhi),
                "case {case} at {isa:?}"
            );
        }
    }
}

#[test]
fn a_page_build_reads_every_key_format_in_place_as_its_decode() {
    use crate::keys::Encoded;
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for case in 0..300 {
        let n = rng.random_range(1..70);
        let t = rng.random_range(1..18);
        let u16s: Vec<u16> = (0..n * t).map(|_| rng.random_range(0..=u16::MAX)).collect();
        let u8s: Vec<u8> = (0..n * t).map(|_| rng.random_range(0..=u8::MAX)).collect();
        let scales: Option<Vec<f32>> =
            (case % 2 == 0).then(|| (0..t).map(|_| rng.random_range(0.01f32..3.0)).collect());
        for rows in [
            Encoded::Bf16(&u16s),
            Encoded::F16(&u16s),
            Encoded::Fp8E4m3(&u8s),
        ] {
            let mut dec = vec![0.0f32; rows.len()];
            rows.decode_at(crate::simd::Isa::Scalar, 0, &mut dec);
            let (mut wl, mut wh) = (vec![0.0f32; n], vec![0.0f32; n]);
            portable::page_bounds_f32(&dec, scales.as_deref(), &mut wl, &mut wh);
            for isa in isas_for_test() {
                let (mut lo, mut hi) = (vec![7.0f32; n], vec![7.0f32; n]);
                page_bounds(isa, rows, scales.as_deref(), &mut lo, &mut hi, &[]);
                assert!(
                    same_bits(&lo, &wl) && same_bits(&hi, &wh),
                    "case {case} {:?} at {isa:?}",
                    rows.format()
                );
            }
        }
    }
}
