//! The geometry of a strided tensor view over a flat storage.
//!
//! A pickled torch tensor is a view (offset, sizes, strides) into a storage
//! of `capacity` elements. Before a byte is read the view is checked to lie
//! inside the storage, overlapping views are bounded, size-1 dimensions are
//! dropped and contiguous dimensions merged, so readers walk the fewest,
//! longest runs of elements.

use crate::formats::pickle::DType;
use crate::formats::tensor_data::FloatKind;

impl FloatKind {
    /// The reducible float kind of a pickled torch dtype.
    pub fn of(d: DType) -> Option<FloatKind> {
        match d.name {
            "float32" => Some(FloatKind::F32),
            "float64" => Some(FloatKind::F64),
            "float16" => Some(FloatKind::F16),
            "bfloat16" => Some(FloatKind::BF16),
            _ => None,
        }
    }
}

/// A validated tensor view, relative to the first element it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPlan {
    pub numel: u64,
    /// First storage element read.
    pub first: u64,
    /// Elements from `first` through the last element read.
    pub span: u64,
    /// (size, stride) pairs, size-1 dims dropped and mergeable dims merged,
    /// outermost first. Empty for a scalar.
    pub dims: Vec<(u64, u64)>,
}

/// Logical elements a view may have beyond its storage's size (broadcast
/// views with stride 0); past this, such views are refused.
const MAX_OVERLAP_NUMEL: u64 = 1 << 24;

/// Check that the view (offset, size, stride) lies inside a storage of
/// `capacity` elements and describe how to walk it.
pub fn plan_view(
    offset: u64,
    size: &[u64],
    stride: &[u64],
    capacity: u64,
) -> std::result::Result<ViewPlan, String> {
    if size.len() != stride.len() {
        return Err("size and stride have different lengths".into());
    }
    let numel = size
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or("element count overflows")?;
    if numel == 0 {
        if offset > capacity {
            return Err(format!(
                "view offset {offset} is past the end of its storage ({capacity} elements)"
            ));
        }
        return Ok(ViewPlan {
            numel: 0,
            first: offset,
            span: 0,
            dims: Vec::new(),
        });
    }
    let mut last = offset;
    for (&s, &st) in size.iter().zip(stride) {
        last = (s - 1)
            .checked_mul(st)
            .and_then(|x| last.checked_add(x))
            .ok_or("view extent overflows")?;
    }
    if last >= capacity {
        return Err(format!(
            "tensor view (offset {offset}, size {size:?}, stride {stride:?}) reaches element \
             {last}, past the end of its storage ({capacity} elements)"
        ));
    }
    if numel > capacity && numel > MAX_OVERLAP_NUMEL {
        return Err(format!(
            "tensor view has {numel} elements over a storage of {capacity} (overlapping \
             strides); refusing the work"
        ));
    }
    let mut dims: Vec<(u64, u64)> = Vec::with_capacity(size.len());
    for (&s, &st) in size.iter().zip(stride) {
        if s == 1 {
            continue;
        }
        match dims.last_mut() {
            // The previous (outer) dim steps exactly over this one: merge.
            Some(outer) if outer.1 == st.saturating_mul(s) => {
                *outer = (outer.0 * s, st);
            }
            _ => dims.push((s, st)),
        }
    }
    Ok(ViewPlan {
        numel,
        first: offset,
        span: last - offset + 1,
        dims,
    })
}

/// Call `f(start, len, stride)` for each innermost run of the view: `len`
/// elements starting at element `start` of the planned span (relative to
/// `plan.first`), `stride` elements apart. A scalar view is one run of one.
pub fn for_each_run(
    plan: &ViewPlan,
    mut f: impl FnMut(u64, u64, u64) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    let Some((&(inner_n, inner_stride), outer)) = plan.dims.split_last() else {
        return f(0, 1, 1);
    };
    let mut index = vec![0u64; outer.len()];
    loop {
        let base: u64 = index.iter().zip(outer).map(|(i, d)| i * d.1).sum();
        f(base, inner_n, inner_stride)?;
        // Odometer over the outer dims, innermost fastest.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            index[d] += 1;
            if index[d] < outer[d].0 {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_past_the_storage_are_refused() {
        assert!(plan_view(0, &[10], &[1], 10).is_ok());
        assert!(plan_view(1, &[10], &[1], 10).is_err());
        assert!(plan_view(0, &[4, 3], &[3, 1], 11).is_err());
        assert!(plan_view(0, &[3, 4], &[1, 3], 12).is_ok());
        assert!(plan_view(0, &[u64::MAX, 2], &[1, 1], 10).is_err());
        assert!(plan_view(0, &[2], &[u64::MAX], 10).is_err());
        assert!(plan_view(11, &[0], &[1], 10).is_err());
        assert_eq!(plan_view(10, &[0, 5], &[5, 1], 10).unwrap().numel, 0);
        assert!(plan_view(0, &[1 << 30], &[0], 1).is_err());
    }

    #[test]
    fn contiguous_dims_merge() {
        let plan = plan_view(6, &[2, 3, 4], &[12, 4, 1], 30).unwrap();
        assert_eq!(plan.dims, vec![(24, 1)]);
        assert_eq!(plan.span, 24);
    }
}
