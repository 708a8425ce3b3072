//! A series kept to a bounded number of points however long it grows.
//!
//! Why: a log of a hundred million records, or a guard watching a run that
//! logs every step for weeks, must not hold every point. Keeping every
//! `stride`-th point, the stride doubling each time the cap is reached,
//! keeps the curve's shape (an even sample of the whole run) in memory
//! bounded by the cap, with work linear in the points read. What a sample
//! would lose and a verdict needs is kept beside it: the last point, and
//! the notable points (a non-finite value, a jump) while they are few.

use std::collections::TryReserveError;

/// Points of one series kept while it is read, at most `cap` of them
/// (plus the last): when the cap is reached every other kept point is let
/// go and from then on every `stride`-th point read is kept, the stride
/// doubling each time. Notable points (as the caller's `notable` says: a
/// non-finite value, say) are kept off the stride too while they are at
/// most a quarter of the cap (past that they are thinned like the rest,
/// the first kept); the first and the last point read are always kept.
/// Each thinning frees at least a quarter of the cap, so the work stays
/// linear in the points read.
#[derive(Debug, Clone)]
pub struct Thinned<T> {
    kept: Vec<T>,
    cap: usize,
    stride: u64,
    read: u64,
    notable_read: u64,
    /// The last point read, when it was not kept.
    last: Option<T>,
    keep_notable: bool,
    notable: fn(&T) -> bool,
}

/// What a [`Thinned`] kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept<T> {
    /// The points kept, in reading order.
    pub points: Vec<T>,
    /// Every `stride`-th point read was kept (1: every point).
    pub stride: u64,
    /// Points read.
    pub read: u64,
    /// Notable points read (kept or not).
    pub notable_read: u64,
}

impl<T: Copy> Thinned<T> {
    /// Keep at most `cap` (at least 16) points; `notable` says whether a
    /// point is kept off the stride while such points are few.
    pub fn new(cap: usize, notable: fn(&T) -> bool) -> Thinned<T> {
        Thinned {
            kept: Vec::new(),
            cap: cap.max(16),
            stride: 1,
            read: 0,
            notable_read: 0,
            last: None,
            keep_notable: true,
            notable,
        }
    }

    /// Points read so far.
    pub fn read(&self) -> u64 {
        self.read
    }

    /// Every `stride`-th point read is kept (1: every point so far).
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Points kept so far.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether no point is kept yet.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// The points as they stand: those kept, then the last point read
    /// where it was not kept.
    pub fn points(&self) -> impl Iterator<Item = &T> {
        self.kept.iter().chain(self.last.as_ref())
    }

    /// The newest point (kept or not), to be replaced in place: a record
    /// logged again for the same step.
    pub fn newest_mut(&mut self) -> Option<&mut T> {
        match self.last.as_mut() {
            Some(last) => Some(last),
            None => self.kept.last_mut(),
        }
    }

    /// The kept points, for a point from the past to be put in its place
    /// (a resumed run logging an earlier step again). The cap holds at the
    /// next [`Thinned::push`].
    pub fn kept_mut(&mut self) -> &mut Vec<T> {
        &mut self.kept
    }

    fn wanted(&self, index: u64, notable: bool) -> bool {
        index % self.stride == 0 || (notable && self.keep_notable)
    }

    /// Take the next point read; an allocation that fails is an error
    /// (never an abort).
    pub fn push(&mut self, point: T) -> Result<(), TryReserveError> {
        let index = self.read;
        self.read += 1;
        let notable = (self.notable)(&point);
        self.notable_read += u64::from(notable);
        if !self.wanted(index, notable) {
            self.last = Some(point);
            return Ok(());
        }
        if self.kept.len() >= self.cap {
            self.thin();
            if !self.wanted(index, notable) {
                self.last = Some(point);
                return Ok(());
            }
        }
        if self.kept.len() == self.kept.capacity() {
            let len = self.kept.len();
            let grown = (len * 2).max(16).min(self.cap).max(len + 1);
            self.kept.try_reserve_exact(grown - len)?;
        }
        self.kept.push(point);
        // A point held as the last is let go once a newer one is kept.
        self.last = None;
        Ok(())
    }

    /// Let every other kept point go (see the type's doc).
    fn thin(&mut self) {
        let notable = self.notable;
        let many = self.kept.iter().filter(|p| notable(p)).count();
        if many > self.cap / 4 {
            self.keep_notable = false;
        }
        let first_notable = self.kept.iter().position(notable);
        let last = self.kept.len().saturating_sub(1);
        let keep_notable = self.keep_notable;
        let mut at = 0usize;
        self.kept.retain(|p| {
            let keep = at % 2 == 0
                || at == last
                || Some(at) == first_notable
                || (keep_notable && notable(p));
            at += 1;
            keep
        });
        self.stride = self.stride.saturating_mul(2);
    }

    /// Let go of the newest points for which `past` holds (a run rolled
    /// back to an earlier step: the steps after it are of a discarded
    /// timeline), and return how many points read they stood for: exact
    /// while nothing was thinned, else the dropped kept points times the
    /// stride (an estimate, as the sample is). Points are dropped from the
    /// newest back, up to the first for which `past` does not hold.
    pub fn drop_newest_while(&mut self, past: impl Fn(&T) -> bool) -> u64 {
        let mut dropped: u64 = 0;
        if self.last.as_ref().is_some_and(&past) {
            self.last = None;
            dropped += 1;
        }
        let keep = self
            .kept
            .iter()
            .rposition(|p| !past(p))
            .map_or(0, |i| i + 1);
        let gone = (self.kept.len() - keep) as u64;
        self.kept.truncate(keep);
        dropped += gone.saturating_mul(self.stride);
        let dropped = dropped.min(self.read);
        self.read -= dropped;
        dropped
    }

    /// The points kept, the last point read among them.
    pub fn finish(mut self) -> Result<Kept<T>, TryReserveError> {
        if let Some(last) = self.last.take() {
            self.kept.try_reserve_exact(1)?;
            self.kept.push(last);
        }
        Ok(Kept {
            points: self.kept,
            stride: self.stride,
            read: self.read,
            notable_read: self.notable_read,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_newest_points_counts_what_they_stood_for() {
        let mut t = Thinned::new(16, |_: &(i64, f64)| false);
        for i in 0..10 {
            t.push((i, 1.0)).unwrap();
        }
        assert_eq!(t.drop_newest_while(|p| p.0 > 6), 3);
        assert_eq!(t.read(), 7);
        assert_eq!(
            t.points().map(|p| p.0).collect::<Vec<_>>(),
            (0..7).collect::<Vec<_>>()
        );
        // Thinned: each kept point stands for `stride` read.
        let mut t = Thinned::new(16, |_: &(i64, f64)| false);
        for i in 0..100 {
            t.push((i, 1.0)).unwrap();
        }
        let stride = t.stride();
        assert!(stride > 1);
        let newest_kept = t.points().filter(|p| p.0 <= 98).count();
        let dropped = t.drop_newest_while(|p| p.0 >= 50);
        assert!(t.points().all(|p| p.0 < 50));
        assert!(
            dropped >= 50 - stride && dropped <= 50 + stride,
            "{dropped}"
        );
        assert!(newest_kept > t.len());
        // Nothing past: nothing dropped.
        assert_eq!(t.drop_newest_while(|p| p.0 >= 1000), 0);
    }

    fn nonfinite(p: &(i64, f64)) -> bool {
        !p.1.is_finite()
    }

    #[test]
    fn thinning_keeps_the_cap_the_first_the_last_and_the_notable() {
        let mut kept = Thinned::new(64, nonfinite);
        for i in 0..100_000i64 {
            let v = if i == 70_001 { f64::NAN } else { i as f64 };
            kept.push((i, v)).unwrap();
        }
        let kept = kept.finish().unwrap();
        assert!(kept.points.len() <= 65, "{}", kept.points.len());
        assert!(kept.stride.is_power_of_two() && kept.stride > 1);
        assert_eq!((kept.read, kept.notable_read), (100_000, 1));
        assert_eq!(kept.points[0], (0, 0.0));
        assert_eq!(kept.points.last(), Some(&(99_999, 99_999.0)));
        assert!(kept.points.iter().any(|p| p.0 == 70_001 && p.1.is_nan()));
        assert!(kept.points.windows(2).all(|w| w[0].0 < w[1].0));
        // A flood of notable points is bounded too (the first kept).
        let mut nan = Thinned::new(64, nonfinite);
        for i in 0..100_000i64 {
            nan.push((i, if i < 10 { 1.0 } else { f64::NAN })).unwrap();
        }
        let nan = nan.finish().unwrap();
        assert!(nan.points.len() <= 65, "{}", nan.points.len());
        assert!(nan.points.iter().any(|p| p.0 == 10));
        assert_eq!(nan.notable_read, 100_000 - 10);
        // Under the cap nothing is thinned.
        let mut few = Thinned::new(64, nonfinite);
        for i in 0..64i64 {
            few.push((i, 1.0)).unwrap();
        }
        let few = few.finish().unwrap();
        assert_eq!((few.points.len(), few.stride), (64, 1));
    }

    #[test]
    fn the_points_as_they_stand_end_with_the_newest_and_it_can_be_replaced() {
        let mut t = Thinned::new(16, nonfinite);
        for i in 0..1000i64 {
            t.push((i, 1.0)).unwrap();
            assert_eq!(t.points().last(), Some(&(i, 1.0)));
            assert!(t.points().count() <= 17);
        }
        assert!(t.stride() > 1);
        *t.newest_mut().unwrap() = (999, 2.0);
        assert_eq!(t.points().last(), Some(&(999, 2.0)));
        let n = t.points().count();
        let kept = t.finish().unwrap();
        assert_eq!(kept.points.len(), n);
        assert_eq!(kept.points.last(), Some(&(999, 2.0)));
    }
}
