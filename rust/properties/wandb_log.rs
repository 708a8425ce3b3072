//! Properties of the W&B run log reader: any bytes after the header are
//! read without a panic and within the caps, and generated history rows
//! come back with their values and steps, whatever the block boundaries,
//! bit flips elsewhere, or a torn tail.

use super::*;
use adapterprobe_core::formats::logs::wandb_run::wire::{
    encode_bytes as bytes_field, encode_varint as varint,
};
use adapterprobe_core::formats::logs::wandb_run::{framing::frame, parse_run, MAX_KEYS};

/// A history record of one `loss` value at W&B step `step`, padded with a
/// filler key of `pad` bytes so rows cross block boundaries.
fn loss_row(step: u64, loss: f64, pad: usize) -> Vec<u8> {
    let json = if loss.is_nan() {
        "NaN".to_string()
    } else {
        format!("{loss:?}")
    };
    let mut item = bytes_field(2, b"loss");
    item.extend(bytes_field(16, json.as_bytes()));
    let mut filler = bytes_field(2, b"note");
    filler.extend(bytes_field(
        16,
        format!("\"{}\"", "x".repeat(pad)).as_bytes(),
    ));
    let mut row = bytes_field(1, &item);
    row.extend(bytes_field(1, &filler));
    let mut st = vec![0x08];
    st.extend(varint(step));
    row.extend(bytes_field(2, &st));
    bytes_field(2, &row)
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..70_000)) {
        let (run, _) = parse_run(&bytes[..]);
        prop_assert!(run.series.len() <= MAX_KEYS);
        prop_assert!(run.series.values().map(Vec::len).sum::<usize>() <= run.rows * MAX_KEYS);
    }

    #[test]
    fn generated_rows_round_trip(
        rows in proptest::collection::vec((-1e6f64..1e6, 0usize..40_000), 1..12)
    ) {
        let records: Vec<Vec<u8>> = rows
            .iter()
            .enumerate()
            .map(|(i, (loss, pad))| loss_row(i as u64, *loss, *pad))
            .collect();
        let log = frame(&records);
        let (run, io_error) = parse_run(&log[7..]);
        prop_assert!(!io_error && !run.torn && run.corrupt_blocks == 0);
        let want: Vec<(i64, f64)> = rows.iter().enumerate().map(|(i, (l, _))| (i as i64, *l)).collect();
        prop_assert_eq!(&run.series["loss"], &want);
    }

    #[test]
    fn a_flipped_or_cut_log_keeps_only_rows_that_were_written(
        rows in proptest::collection::vec((0.0f64..10.0, 0usize..20_000), 1..10),
        flip in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let records: Vec<Vec<u8>> = rows
            .iter()
            .enumerate()
            .map(|(i, (loss, pad))| loss_row(i as u64, *loss, *pad))
            .collect();
        let mut log = frame(&records);
        let at = 7 + flip.index(log.len() - 7);
        log[at] ^= 0x5a;
        let end = 7 + cut.index(log.len() - 6);
        let (run, _) = parse_run(&log[7..end]);
        // A bit flip is caught by the chunk's checksum: every row read is
        // one that was written, at its own step.
        for (step, loss) in run.series.get("loss").into_iter().flatten() {
            let written = usize::try_from(*step).ok().and_then(|s| rows.get(s));
            prop_assert_eq!(written.map(|r| r.0), Some(*loss));
        }
    }
}
