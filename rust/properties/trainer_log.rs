//! Properties of LLaMA-Factory's `trainer_log.jsonl` reader: any bytes are
//! read without a panic, and the records of generated logs come back as
//! they were written, whatever junk lines sit between.

use super::*;
use adapterprobe_core::formats::logs::trainer_log::parse_trainer_log;

/// A line as the log callback writes it, with optional fields left out or
/// written as null, as releases differ.
fn record() -> impl Strategy<Value = (i64, Option<f64>, Option<f64>, Option<f64>, bool)> {
    (
        0i64..1_000_000,
        proptest::option::of(0.0f64..100.0),
        proptest::option::of(0.0f64..100.0),
        proptest::option::of(1e-7f64..1e-2),
        any::<bool>(),
    )
}

fn field(name: &str, v: Option<f64>, nulls: bool) -> Option<String> {
    match v {
        Some(x) => Some(format!("\"{name}\": {x:?}")),
        None if nulls => Some(format!("\"{name}\": null")),
        None => None,
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let (state, records) = parse_trainer_log(&bytes);
        prop_assert!(state.train_points.len() <= records);
    }

    #[test]
    fn records_are_read_between_junk_lines(
        lines in proptest::collection::vec((record(), "[^\n{]{0,30}"), 0..40)
    ) {
        let mut text = String::new();
        for ((step, loss, eval, lr, nulls), junk) in &lines {
            let mut fields = vec![format!("\"current_steps\": {step}"), "\"total_steps\": 1000000".into()];
            fields.extend(field("loss", *loss, *nulls));
            fields.extend(field("eval_loss", *eval, *nulls));
            fields.extend(field("lr", *lr, *nulls));
            text.push_str(&format!("{{{}}}\n{junk}\n", fields.join(", ")));
        }
        let (state, records) = parse_trainer_log(text.as_bytes());
        // What was written (junk lines never start an object).
        let n = lines.len();
        let train: Vec<(i64, f64)> = lines.iter().filter_map(|((st, l, ..), _)| Some((*st, (*l)?))).collect();
        let eval: Vec<(i64, f64)> = lines.iter().filter_map(|((st, _, e, ..), _)| Some((*st, (*e)?))).collect();
        prop_assert_eq!(records, n);
        prop_assert_eq!(state.train_points, train);
        prop_assert_eq!(state.eval_points, eval);
    }
}
