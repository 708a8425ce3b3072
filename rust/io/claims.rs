//! Memory for sizes a file claims.
//!
//! Why one place: a header may say a tensor holds 2^27 values while the
//! file is a 16 KiB sparse hole. Every buffer sized by such a claim is made
//! here, so each is capped by what its caller can justify and an
//! allocation the system refuses is the file's error, never an abort of
//! the process (Rust aborts on a failed infallible allocation).

/// Refuse a claim of `count` items of `item_bytes` each above `limit`, for
/// callers that hold several claimed buffers together and cap their sum.
/// The error names `what` was claimed.
pub fn check_claim(count: u64, item_bytes: u64, limit: u64, what: &str) -> Result<(), String> {
    let mb = |n: u64| n.saturating_mul(item_bytes) >> 20;
    if count > limit {
        return Err(format!(
            "{what} claims {count} values ({} MB in memory), more than the {limit} \
             ({} MB) read at once",
            mb(count),
            mb(limit)
        ));
    }
    Ok(())
}

/// An empty vector with room for `count` items, where `count` comes from a
/// file: refused when it exceeds `limit` (see [`check_claim`]) or the
/// system will not allocate it.
pub fn claimed_vec<T>(count: u64, limit: u64, what: &str) -> Result<Vec<T>, String> {
    let item = std::mem::size_of::<T>().max(1) as u64;
    let mb = |n: u64| n.saturating_mul(item) >> 20;
    check_claim(count, item, limit, what)?;
    let mut out = Vec::new();
    let n = usize::try_from(count).map_err(|_| format!("{what} claims {count} values"))?;
    out.try_reserve_exact(n).map_err(|_| {
        format!(
            "cannot allocate {} MB for the {count} values {what} claims",
            mb(count)
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::claimed_vec;

    #[test]
    fn within_the_limit_the_room_is_reserved() {
        let v: Vec<f64> = claimed_vec(1000, 1000, "t").unwrap();
        assert!(v.is_empty() && v.capacity() >= 1000);
    }

    #[test]
    fn above_the_limit_is_refused_before_allocating() {
        let e = claimed_vec::<f64>(1 << 40, 1 << 20, "tensor \"x\"").unwrap_err();
        assert!(
            e.contains("tensor \"x\" claims 1099511627776 values"),
            "{e}"
        );
        assert!(e.contains("8388608 MB"), "{e}");
    }

    #[test]
    fn what_the_system_refuses_is_an_error() {
        let e = claimed_vec::<f64>(u64::MAX / 16, u64::MAX, "t").unwrap_err();
        assert!(e.contains("cannot allocate") || e.contains("claims"), "{e}");
    }
}
