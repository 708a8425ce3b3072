//! CPython 3.11's `list.sort` (Objects/listobject.c: timsort with
//! powersort's merge order and galloping), step for step, on a slice of
//! indices compared by a caller's `lt`.
//!
//! Any stable sort gives Python's order for a total order; this one also
//! gives it where `<` is not one (floats with NaN), which is what the
//! plain-Python reference does and so what the kernels must do.

const MIN_GALLOP: usize = 7;

/// The comparison: is the item `a` less than the item `b`?
type Lt<'a> = &'a dyn Fn(usize, usize) -> bool;

struct Run {
    base: usize,
    len: usize,
    power: u32,
}

struct Merge<'a> {
    a: &'a mut [usize],
    lt: Lt<'a>,
    min_gallop: usize,
    pending: Vec<Run>,
}

/// `s[i]` (0 out of range, which the algorithm's invariants rule out).
fn at(s: &[usize], i: usize) -> usize {
    s.get(i).copied().unwrap_or(0)
}

fn set(s: &mut [usize], i: usize, v: usize) {
    if let Some(slot) = s.get_mut(i) {
        *slot = v;
    }
}

fn copy(src: &[usize], from: usize, dst: &mut [usize], to: usize, n: usize) {
    for j in 0..n {
        set(dst, to + j, at(src, from + j));
    }
}

/// Sort `a` in place exactly as CPython 3.11 sorts a list.
pub fn sort(a: &mut [usize], lt: Lt<'_>) {
    let n = a.len();
    if n < 2 {
        return;
    }
    let minrun = compute_minrun(n);
    let mut ms = Merge {
        a,
        lt,
        min_gallop: MIN_GALLOP,
        pending: Vec::new(),
    };
    let mut lo = 0;
    let mut remaining = n;
    while remaining > 0 {
        let (mut run, descending) = ms.count_run(lo, lo + remaining);
        if descending {
            if let Some(s) = ms.a.get_mut(lo..lo + run) {
                s.reverse();
            }
        }
        if run < minrun {
            let force = remaining.min(minrun);
            ms.binarysort(lo, lo + force, lo + run);
            run = force;
        }
        ms.found_new_run(run, n);
        ms.pending.push(Run {
            base: lo,
            len: run,
            power: 0,
        });
        lo += run;
        remaining -= run;
    }
    ms.force_collapse();
}

fn compute_minrun(mut n: usize) -> usize {
    let mut r = 0;
    while n >= 64 {
        r |= n & 1;
        n >>= 1;
    }
    n + r
}

fn powerloop(s1: usize, n1: usize, n2: usize, n: usize) -> u32 {
    let mut result = 0;
    let mut a = 2 * s1 + n1;
    let mut b = a + n1 + n2;
    loop {
        result += 1;
        if a >= n {
            a -= n;
            b -= n;
        } else if b >= n {
            break;
        }
        a <<= 1;
        b <<= 1;
    }
    result
}

/// Where `key` goes in the sorted `s[base..base + n]`, left of equals
/// (galloping from `hint`).
fn gallop_left(s: &[usize], lt: Lt<'_>, key: usize, base: usize, n: usize, hint: usize) -> usize {
    let below = |i: usize| lt(at(s, base + i), key);
    let (mut lastofs, mut ofs) = (0usize, 1usize);
    let (mut lo, mut hi);
    if below(hint) {
        let maxofs = n - hint;
        while ofs < maxofs && below(hint + ofs) {
            lastofs = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(maxofs);
        lo = lastofs + hint + 1;
        hi = ofs + hint;
    } else {
        let maxofs = hint + 1;
        while ofs < maxofs && !below(hint - ofs) {
            lastofs = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(maxofs);
        lo = hint + 1 - ofs;
        hi = hint - lastofs;
    }
    while lo < hi {
        let m = lo + ((hi - lo) >> 1);
        if below(m) {
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    hi
}

/// Where `key` goes in the sorted `s[base..base + n]`, right of equals.
fn gallop_right(s: &[usize], lt: Lt<'_>, key: usize, base: usize, n: usize, hint: usize) -> usize {
    let above = |i: usize| lt(key, at(s, base + i));
    let (mut lastofs, mut ofs) = (0usize, 1usize);
    let (mut lo, mut hi);
    if above(hint) {
        let maxofs = hint + 1;
        while ofs < maxofs && above(hint - ofs) {
            lastofs = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(maxofs);
        lo = hint + 1 - ofs;
        hi = hint - lastofs;
    } else {
        let maxofs = n - hint;
        while ofs < maxofs && !above(hint + ofs) {
            lastofs = ofs;
            ofs = (ofs << 1) + 1;
        }
        ofs = ofs.min(maxofs);
        lo = lastofs + hint + 1;
        hi = ofs + hint;
    }
    while lo < hi {
        let m = lo + ((hi - lo) >> 1);
        if above(m) {
            hi = m;
        } else {
            lo = m + 1;
        }
    }
    hi
}

impl Merge<'_> {
    fn lt_at(&self, i: usize, j: usize) -> bool {
        (self.lt)(at(self.a, i), at(self.a, j))
    }

    /// Length of the run starting at `lo` (before `hi`), and whether it is
    /// strictly descending.
    fn count_run(&self, lo: usize, hi: usize) -> (usize, bool) {
        if lo + 1 == hi {
            return (1, false);
        }
        let descending = self.lt_at(lo + 1, lo);
        let mut p = lo + 2;
        while p < hi && self.lt_at(p, p - 1) == descending {
            p += 1;
        }
        (p - lo, descending)
    }

    fn binarysort(&mut self, lo: usize, hi: usize, mut start: usize) {
        if lo == start {
            start += 1;
        }
        while start < hi {
            let pivot = at(self.a, start);
            let (mut l, mut r) = (lo, start);
            loop {
                let p = l + ((r - l) >> 1);
                if (self.lt)(pivot, at(self.a, p)) {
                    r = p;
                } else {
                    l = p + 1;
                }
                if l >= r {
                    break;
                }
            }
            if let Some(s) = self.a.get_mut(l..=start) {
                s.rotate_right(1);
            }
            start += 1;
        }
    }

    fn found_new_run(&mut self, n2: usize, total: usize) {
        let Some(last) = self.pending.last() else {
            return;
        };
        let power = powerloop(last.base, last.len, n2, total);
        while self.pending.len() > 1 {
            let i = self.pending.len() - 2;
            if self.pending.get(i).is_none_or(|r| r.power <= power) {
                break;
            }
            self.merge_at(i);
        }
        if let Some(last) = self.pending.last_mut() {
            last.power = power;
        }
    }

    fn force_collapse(&mut self) {
        while self.pending.len() > 1 {
            let mut n = self.pending.len() - 2;
            if n > 0 {
                let before = self.pending.get(n - 1).map_or(0, |r| r.len);
                let after = self.pending.get(n + 1).map_or(0, |r| r.len);
                if before < after {
                    n -= 1;
                }
            }
            self.merge_at(n);
        }
    }

    fn merge_at(&mut self, i: usize) {
        let (Some(ra), Some(rb)) = (self.pending.get(i), self.pending.get(i + 1)) else {
            return;
        };
        let (mut pa, mut na, pb, nb) = (ra.base, ra.len, rb.base, rb.len);
        if let Some(r) = self.pending.get_mut(i) {
            r.len = na + nb;
        }
        self.pending.remove(i + 1);
        // Where b starts in a: what comes before stays.
        let k = gallop_right(self.a, self.lt, at(self.a, pb), pa, na, 0);
        pa += k;
        na -= k;
        if na == 0 {
            return;
        }
        // Where a ends in b: what comes after stays.
        let nb = gallop_left(self.a, self.lt, at(self.a, pa + na - 1), pb, nb, nb - 1);
        if nb == 0 {
            return;
        }
        if na <= nb {
            self.merge_lo(pa, na, pb, nb);
        } else {
            self.merge_hi(pa, na, pb, nb);
        }
    }

    /// Merge the runs `a[pa..pa + na]` and `a[pb..pb + nb]` (`pb = pa +
    /// na`, `na <= nb`) left to right, a copied aside.
    fn merge_lo(&mut self, pa: usize, mut na: usize, pb: usize, mut nb: usize) {
        let tmp: Vec<usize> = self
            .a
            .get(pa..pa + na)
            .map(<[usize]>::to_vec)
            .unwrap_or_default();
        let lt = self.lt;
        let (mut ia, mut ib, mut dest) = (0usize, pb, pa);
        let mut min_gallop = self.min_gallop;
        set(self.a, dest, at(self.a, ib));
        dest += 1;
        ib += 1;
        nb -= 1;
        'done: {
            if nb == 0 {
                break 'done;
            }
            if na == 1 {
                return self.copy_b_then_last_a(dest, ib, nb, at(&tmp, ia));
            }
            loop {
                let (mut acount, mut bcount) = (0usize, 0usize);
                loop {
                    if lt(at(self.a, ib), at(&tmp, ia)) {
                        set(self.a, dest, at(self.a, ib));
                        dest += 1;
                        ib += 1;
                        bcount += 1;
                        acount = 0;
                        nb -= 1;
                        if nb == 0 {
                            break 'done;
                        }
                        if bcount >= min_gallop {
                            break;
                        }
                    } else {
                        set(self.a, dest, at(&tmp, ia));
                        dest += 1;
                        ia += 1;
                        acount += 1;
                        bcount = 0;
                        na -= 1;
                        if na == 1 {
                            return self.copy_b_then_last_a(dest, ib, nb, at(&tmp, ia));
                        }
                        if acount >= min_gallop {
                            break;
                        }
                    }
                }
                min_gallop += 1;
                loop {
                    min_gallop -= usize::from(min_gallop > 1);
                    self.min_gallop = min_gallop;
                    let k = gallop_right(&tmp, lt, at(self.a, ib), ia, na, 0);
                    acount = k;
                    if k > 0 {
                        copy(&tmp, ia, self.a, dest, k);
                        dest += k;
                        ia += k;
                        na -= k;
                        if na == 1 {
                            return self.copy_b_then_last_a(dest, ib, nb, at(&tmp, ia));
                        }
                        // Only an inconsistent `<` (NaN) gets here.
                        if na == 0 {
                            break 'done;
                        }
                    }
                    set(self.a, dest, at(self.a, ib));
                    dest += 1;
                    ib += 1;
                    nb -= 1;
                    if nb == 0 {
                        break 'done;
                    }
                    let k = gallop_left(self.a, lt, at(&tmp, ia), ib, nb, 0);
                    bcount = k;
                    if k > 0 {
                        self.a.copy_within(ib..ib + k, dest);
                        dest += k;
                        ib += k;
                        nb -= k;
                        if nb == 0 {
                            break 'done;
                        }
                    }
                    set(self.a, dest, at(&tmp, ia));
                    dest += 1;
                    ia += 1;
                    na -= 1;
                    if na == 1 {
                        return self.copy_b_then_last_a(dest, ib, nb, at(&tmp, ia));
                    }
                    if acount < MIN_GALLOP && bcount < MIN_GALLOP {
                        break;
                    }
                }
                min_gallop += 1;
                self.min_gallop = min_gallop;
            }
        }
        copy(&tmp, ia, self.a, dest, na);
    }

    /// The rest of b, then a's last element after it.
    fn copy_b_then_last_a(&mut self, dest: usize, ib: usize, nb: usize, last_a: usize) {
        self.a.copy_within(ib..ib + nb, dest);
        set(self.a, dest + nb, last_a);
    }

    /// Merge the runs `a[pa..pa + na]` and `a[pb..pb + nb]` (`na > nb`)
    /// right to left, b copied aside. Positions count one past the current
    /// element, so none goes below zero.
    fn merge_hi(&mut self, pa: usize, mut na: usize, pb: usize, mut nb: usize) {
        let tmp: Vec<usize> = self
            .a
            .get(pb..pb + nb)
            .map(<[usize]>::to_vec)
            .unwrap_or_default();
        let lt = self.lt;
        let (mut ia, mut ib, mut dest) = (pa + na, nb, pb + nb);
        let mut min_gallop = self.min_gallop;
        dest -= 1;
        ia -= 1;
        set(self.a, dest, at(self.a, ia));
        na -= 1;
        'done: {
            if na == 0 {
                break 'done;
            }
            if nb == 1 {
                return self.copy_a_then_first_b(dest, ia, na, at(&tmp, 0));
            }
            loop {
                let (mut acount, mut bcount) = (0usize, 0usize);
                loop {
                    if lt(at(&tmp, ib - 1), at(self.a, ia - 1)) {
                        dest -= 1;
                        ia -= 1;
                        set(self.a, dest, at(self.a, ia));
                        acount += 1;
                        bcount = 0;
                        na -= 1;
                        if na == 0 {
                            break 'done;
                        }
                        if acount >= min_gallop {
                            break;
                        }
                    } else {
                        dest -= 1;
                        ib -= 1;
                        set(self.a, dest, at(&tmp, ib));
                        bcount += 1;
                        acount = 0;
                        nb -= 1;
                        if nb == 1 {
                            return self.copy_a_then_first_b(dest, ia, na, at(&tmp, 0));
                        }
                        if bcount >= min_gallop {
                            break;
                        }
                    }
                }
                min_gallop += 1;
                loop {
                    min_gallop -= usize::from(min_gallop > 1);
                    self.min_gallop = min_gallop;
                    let k = na - gallop_right(self.a, lt, at(&tmp, ib - 1), pa, na, na - 1);
                    acount = k;
                    if k > 0 {
                        dest -= k;
                        ia -= k;
                        self.a.copy_within(ia..ia + k, dest);
                        na -= k;
                        if na == 0 {
                            break 'done;
                        }
                    }
                    dest -= 1;
                    ib -= 1;
                    set(self.a, dest, at(&tmp, ib));
                    nb -= 1;
                    if nb == 1 {
                        return self.copy_a_then_first_b(dest, ia, na, at(&tmp, 0));
                    }
                    let k = nb - gallop_left(&tmp, lt, at(self.a, ia - 1), 0, nb, nb - 1);
                    bcount = k;
                    if k > 0 {
                        dest -= k;
                        ib -= k;
                        copy(&tmp, ib, self.a, dest, k);
                        nb -= k;
                        if nb == 1 {
                            return self.copy_a_then_first_b(dest, ia, na, at(&tmp, 0));
                        }
                        // Only an inconsistent `<` (NaN) gets here.
                        if nb == 0 {
                            break 'done;
                        }
                    }
                    dest -= 1;
                    ia -= 1;
                    set(self.a, dest, at(self.a, ia));
                    na -= 1;
                    if na == 0 {
                        break 'done;
                    }
                    if acount < MIN_GALLOP && bcount < MIN_GALLOP {
                        break;
                    }
                }
                min_gallop += 1;
                self.min_gallop = min_gallop;
            }
        }
        copy(&tmp, 0, self.a, dest - nb, nb);
    }

    /// a's remaining `na` elements (ending before `ia`) move up to end
    /// before `dest`; b's first element goes in front of them.
    fn copy_a_then_first_b(&mut self, dest: usize, ia: usize, na: usize, first_b: usize) {
        self.a.copy_within(ia - na..ia, dest - na);
        set(self.a, dest - na - 1, first_b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(xs: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..xs.len()).collect();
        let lt = |a: usize, b: usize| xs.get(a) < xs.get(b);
        sort(&mut idx, &lt);
        idx.iter().filter_map(|&i| xs.get(i).copied()).collect()
    }

    #[test]
    fn sorts_like_a_stable_sort_for_a_total_order() {
        // A pseudo-random sequence long enough for runs, merges and galloping.
        let mut x = 12345u64;
        for n in [0usize, 1, 2, 3, 63, 64, 65, 200, 1000, 5000] {
            let xs: Vec<f64> = (0..n)
                .map(|i| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Runs and duplicates: blocks of ascending values.
                    ((x >> 40) % 50) as f64 + if i % 97 < 40 { i as f64 } else { 0.0 }
                })
                .collect();
            let mut want = xs.clone();
            want.sort_by(|a, b| a.total_cmp(b));
            assert_eq!(sorted(&xs), want, "n = {n}");
        }
    }

    #[test]
    fn stability_keeps_equal_keys_in_order() {
        let keys = [2.0, 1.0, 2.0, 1.0, 0.0, 2.0];
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        let lt = |a: usize, b: usize| keys.get(a) < keys.get(b);
        sort(&mut idx, &lt);
        assert_eq!(idx, [4, 1, 3, 0, 2, 5]);
    }

    #[test]
    fn nan_orders_as_cpython_leaves_it() {
        // sorted([3.0, nan, 1.0, 2.0]) in CPython 3.11: [3.0, nan, 1.0, 2.0]
        // (nan < x and x < nan are both false, so each stays put around it).
        let got = sorted(&[3.0, f64::NAN, 1.0, 2.0]);
        assert_eq!(got.first(), Some(&3.0));
        assert!(got.get(1).is_some_and(|x| x.is_nan()));
        assert_eq!(got.get(2..), Some(&[1.0, 2.0][..]));
    }
}
