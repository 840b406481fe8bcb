//! 1-D k-means palettisation (what Core ML's `kmeans` palettiser does per channel group): the
//! values of a group are replaced by the nearest of `k` fp16 centroids. Lloyd's iterations on
//! sorted values, so each assignment is a binary search between centroid midpoints; k-means++
//! seeding from a fixed seed makes the palette reproducible.

use half::f16;

/// A small deterministic generator (SplitMix64): the same seed gives the same palette.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The index of the centroid (of the sorted `c`) nearest to `v`.
fn nearest(c: &[f32], v: f32) -> usize {
    let i = c.partition_point(|&x| x < v);
    if i == 0 {
        0
    } else if i == c.len() || (v - c[i - 1]) <= (c[i] - v) {
        i - 1
    } else {
        i
    }
}

/// `k` centroids for `values` (sorted ascending, rounded to fp16) and each value's index.
pub fn kmeans(values: &[f32], k: usize, seed: u64, iters: usize) -> (Vec<f32>, Vec<u8>) {
    assert!((1..=256).contains(&k), "palettes hold 1 to 256 entries");
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    sorted.dedup();
    let mut c: Vec<f32> = if sorted.len() <= k {
        sorted.clone()
    } else {
        // k-means++: each next centroid drawn with probability ∝ squared distance.
        let mut rng = SplitMix(seed);
        let mut c = vec![sorted[(rng.unit() * sorted.len() as f64) as usize]];
        let mut d2: Vec<f64> = sorted
            .iter()
            .map(|&v| ((v - c[0]) as f64).powi(2))
            .collect();
        while c.len() < k {
            let total: f64 = d2.iter().sum();
            if total == 0.0 {
                break;
            }
            let mut target = rng.unit() * total;
            let mut pick = sorted.len() - 1;
            for (i, &d) in d2.iter().enumerate() {
                if target < d {
                    pick = i;
                    break;
                }
                target -= d;
            }
            let new = sorted[pick];
            c.push(new);
            for (d, &v) in d2.iter_mut().zip(&sorted) {
                *d = d.min(((v - new) as f64).powi(2));
            }
        }
        c
    };
    c.sort_by(f32::total_cmp);
    // Lloyd's iterations over all values (duplicates weigh as often as they occur).
    for _ in 0..iters {
        let mut sum = vec![0f64; c.len()];
        let mut n = vec![0usize; c.len()];
        for &v in values {
            let i = nearest(&c, v);
            sum[i] += v as f64;
            n[i] += 1;
        }
        let next: Vec<f32> = (c.iter().enumerate())
            .map(|(i, &x)| {
                if n[i] > 0 {
                    (sum[i] / n[i] as f64) as f32
                } else {
                    x
                }
            })
            .collect();
        let moved = next.iter().zip(&c).any(|(a, b)| a != b);
        c = next;
        c.sort_by(f32::total_cmp);
        if !moved {
            break;
        }
    }
    // fp16 palette; indices against the stored (rounded) entries.
    let mut c: Vec<f32> = c.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    c.dedup();
    c.resize(k.max(c.len()), *c.last().unwrap_or(&0.0));
    let idx = values.iter().map(|&v| nearest(&c, v) as u8).collect();
    (c, idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_values_are_exact_and_clusters_are_found() {
        let v = [0.5, -1.0, 0.5, 2.0];
        let (c, i) = kmeans(&v, 16, 1, 10);
        assert_eq!(c.len(), 16);
        for (&x, &j) in v.iter().zip(&i) {
            assert_eq!(c[j as usize], x);
        }
        // Four tight clusters, four centroids: every value within its cluster's spread.
        let v: Vec<f32> = (0..400)
            .map(|n| [-3.0, -1.0, 1.0, 3.0][n % 4] + ((n / 4) as f32 - 50.0) * 1e-3)
            .collect();
        let (c, i) = kmeans(&v, 4, 7, 30);
        for (&x, &j) in v.iter().zip(&i) {
            assert!(
                (c[j as usize] - x).abs() <= 0.051,
                "{x} -> {}",
                c[j as usize]
            );
        }
    }

    #[test]
    fn reproducible_and_no_worse_than_uniform() {
        let v: Vec<f32> = (0..4096)
            .map(|n| ((n as f32 * 0.618).fract() - 0.5) * ((n % 7) as f32 + 1.0))
            .collect();
        let a = kmeans(&v, 16, 42, 20);
        assert_eq!(a, kmeans(&v, 16, 42, 20));
        let mse = |c: &[f32], i: &[u8]| {
            v.iter()
                .zip(i)
                .map(|(&x, &j)| ((x - c[j as usize]) as f64).powi(2))
                .sum::<f64>()
        };
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let uniform: Vec<f32> = (0..16)
            .map(|j| -amax + (j as f32 + 0.5) * amax / 8.0)
            .collect();
        let ui: Vec<u8> = v.iter().map(|&x| nearest(&uniform, x) as u8).collect();
        assert!(mse(&a.0, &a.1) < mse(&uniform, &ui));
    }
}
