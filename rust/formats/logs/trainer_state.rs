//! Read an HF Trainer `trainer_state.json`: its step counters and the loss
//! points of `log_history`.
//!
//! The file is pretty-printed JSON written by Python's `json.dump`, so it can
//! hold the bare tokens `NaN`, `Infinity` and `-Infinity` (a diverged run
//! logs `"loss": NaN`), which serde_json rejects. We parse it with the
//! scanner of `json_line.rs` instead of adding the `jiter` crate: that
//! scanner already speaks exactly Python's dialect, so the dlm reader and
//! this one agree on every number; it validates and skips the many values we
//! do not need without building a tree (a file costs its own bytes and the
//! points, nothing more); its nesting bound is already tested; and the crate
//! gains no dependency.
//!
//! Values convert the way Python's `int()`/`float()` would, as in the dlm
//! reader. A value that cannot be converted (`"abc"`, `null`, a list) is an
//! error naming the entry, never a silently dropped point. Training points
//! are entries with both `"loss"` and `"step"`; evaluation points are those
//! with `"eval_loss"` and `"step"`. Duplicate keys resolve to the last
//! occurrence, as in a Python dict.

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::json_line::{to_loss, to_step, unescape, Scalar, Scanner, MAX_DEPTH};
use crate::io::files::open_regular;
use crate::io::lfs;

/// Largest `trainer_state.json` read (real ones are kilobytes to a few MiB).
pub const MAX_TRAINER_STATE_BYTES: u64 = 512 << 20;

/// What a `trainer_state.json` says about the run.
// `skip_from_py_object`: a result is only handed to Python, never taken
// back, and pyo3 0.29 asks Clone types to choose.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainerState {
    pub path: PathBuf,
    pub global_step: i64,
    pub epoch: Option<f64>,
    pub max_steps: Option<i64>,
    pub logging_steps: Option<i64>,
    /// `(step, loss)` of the training entries of `log_history`, in file
    /// order, as logged (a NaN loss stays NaN here).
    pub train_points: Vec<(i64, f64)>,
    /// `(step, eval_loss)` of the evaluation entries, in file order.
    pub eval_points: Vec<(i64, f64)>,
    /// `(step, grad_norm)` of the training entries that carry one (the
    /// global norm before clipping; NaN stays NaN), in file order.
    pub grad_norm_points: Vec<(i64, f64)>,
    /// `(step, learning_rate)` of the training entries that carry one.
    pub learning_rate_points: Vec<(i64, f64)>,
    /// `(step, reward)` of the entries that carry TRL's mean `reward` (GRPO,
    /// RLOO, online DPO), non-finite kept.
    pub reward_points: Vec<(i64, f64)>,
    /// `(step, margin)` of the entries that carry a preference trainer's
    /// mean reward margin (TRL's DPO family: `rewards/margins`).
    pub margin_points: Vec<(i64, f64)>,
    /// Whether `log_history` holds the Trainer's closing entry (the one
    /// with `train_runtime`, written when `train()` returns): the run
    /// ended normally, at its plan or stopped on purpose.
    pub closed: bool,
}

/// Read the `trainer_state.json` at `path`.
pub fn read_trainer_state(path: &Path) -> Result<TrainerState> {
    let err = |msg: String| Error::new(Area::LogFormat, path, msg);
    let file = open_regular(path, Area::LogFormat)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(Area::LogFormat, path, &e))?
        .len();
    let too_big = || {
        err(format!(
            "is larger than {} MiB; a trainer_state.json is never that big (corrupt or not a trainer state)",
            MAX_TRAINER_STATE_BYTES >> 20
        ))
    };
    if len > MAX_TRAINER_STATE_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_TRAINER_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(Area::LogFormat, path, &e))?;
    if bytes.len() as u64 > MAX_TRAINER_STATE_BYTES {
        return Err(too_big()); // it grew while we read it
    }
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        err(format!(
            "is not UTF-8 text (bad byte at offset {}); a trainer_state.json is JSON",
            e.valid_up_to()
        ))
    })?;
    let mut state = parse_trainer_state(text).map_err(|msg| {
        lfs::pointer_error(Area::LogFormat, path, &bytes).unwrap_or_else(|| err(msg))
    })?;
    state.path = path.to_path_buf();
    Ok(state)
}

/// Parse the text of a `trainer_state.json` (`path` is left empty).
pub fn parse_trainer_state(text: &str) -> std::result::Result<TrainerState, String> {
    let mut s = Scanner::new(text);
    match top_level(&mut s) {
        Ok(state) => Ok(state),
        Err(Fail::Bad(msg)) => Err(msg),
        Err(Fail::Syntax) => Err(syntax_message(text, &s)),
    }
}

/// Why parsing stopped: the text is not JSON, or it is JSON of the wrong shape.
pub(crate) enum Fail {
    Syntax,
    Bad(String),
}

impl From<()> for Fail {
    fn from((): ()) -> Self {
        Fail::Syntax
    }
}

pub(crate) type Parsed<T> = std::result::Result<T, Fail>;

fn syntax_message(text: &str, s: &Scanner) -> String {
    if s.too_deep {
        return format!("JSON nested deeper than {MAX_DEPTH} levels (corrupt or hostile file)");
    }
    let (before, after) = text.as_bytes().split_at(s.i.min(text.len()));
    if after
        .iter()
        .all(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return "JSON ends early (truncated file?)".into();
    }
    let line = 1 + before.iter().filter(|&&c| c == b'\n').count();
    let column = 1 + before.iter().rev().take_while(|&&c| c != b'\n').count();
    format!("invalid JSON at line {line}, column {column}")
}

/// An object key (after its opening quote), escapes decoded only if present.
fn key<'a>(s: &mut Scanner<'a>) -> Parsed<Cow<'a, str>> {
    let (raw, escaped) = s.string_raw()?;
    if escaped {
        return Ok(Cow::Owned(unescape(raw)));
    }
    Ok(Cow::Borrowed(std::str::from_utf8(raw).map_err(|_| ())?))
}

/// Walk the members of an object whose `{` is next, calling `member` with
/// each key once the scanner sits on its value.
pub(crate) fn members<'a>(
    s: &mut Scanner<'a>,
    mut member: impl FnMut(&mut Scanner<'a>, &str) -> Parsed<()>,
) -> Parsed<()> {
    s.eat(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.eat(b'}')?;
        return Ok(());
    }
    loop {
        s.eat(b'"')?;
        let name = key(s)?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        member(s, &name)?;
        if s.closes(b'}')? {
            return Ok(());
        }
    }
}

/// What a value that failed to convert was, for the error message.
fn describe(value: &Scalar) -> &'static str {
    match value {
        Scalar::Str(_) => "a string that is not a number",
        Scalar::Unusable => "null, a list or an object",
        Scalar::Bool(_) => "a boolean",
        _ => "a number out of range",
    }
}

fn integer(value: &Scalar, what: &str) -> Parsed<i64> {
    to_step(value).ok_or_else(|| {
        Fail::Bad(format!(
            "{what} is {}, expected an integer",
            describe(value)
        ))
    })
}

fn number(value: &Scalar, what: &str) -> Parsed<f64> {
    to_loss(value)
        .ok_or_else(|| Fail::Bad(format!("{what} is {}, expected a number", describe(value))))
}

/// Consume a `null` if it comes next.
fn null(s: &mut Scanner) -> Parsed<bool> {
    if s.peek() == Some(b'n') {
        s.literal(b"null")?;
        return Ok(true);
    }
    Ok(false)
}

/// An integer field that may also be `null` (absent information).
fn optional_integer(s: &mut Scanner, what: &str) -> Parsed<Option<i64>> {
    if null(s)? {
        return Ok(None);
    }
    integer(&s.scalar()?, what).map(Some)
}

fn optional_number(s: &mut Scanner, what: &str) -> Parsed<Option<f64>> {
    if null(s)? {
        return Ok(None);
    }
    number(&s.scalar()?, what).map(Some)
}

fn top_level(s: &mut Scanner) -> Parsed<TrainerState> {
    s.ws();
    if s.peek() != Some(b'{') {
        s.skip_value(0)?;
        s.ws();
        if s.peek().is_some() {
            return Err(Fail::Syntax);
        }
        return Err(Fail::Bad(
            "the top level is not a JSON object; a trainer_state.json is an object with \
             global_step and log_history"
                .into(),
        ));
    }
    let mut state = TrainerState::default();
    let (mut global_step, mut history_seen) = (None, false);
    members(s, |s, name| {
        match name {
            "global_step" => global_step = optional_integer(s, "global_step")?,
            "epoch" => state.epoch = optional_number(s, "epoch")?,
            "max_steps" => state.max_steps = optional_integer(s, "max_steps")?,
            "logging_steps" => state.logging_steps = optional_integer(s, "logging_steps")?,
            "log_history" => {
                history_seen = true;
                log_history(s, &mut state)?;
            }
            _ => s.skip_value(1)?,
        }
        Ok(())
    })?;
    s.ws();
    if s.peek().is_some() {
        return Err(Fail::Syntax);
    }
    if !history_seen {
        return Err(Fail::Bad(
            "has no log_history; not an HF trainer_state.json".into(),
        ));
    }
    state.global_step = global_step.ok_or_else(|| {
        Fail::Bad("has no global_step (or it is null); not an HF trainer_state.json".into())
    })?;
    Ok(state)
}

fn log_history(s: &mut Scanner, state: &mut TrainerState) -> Parsed<()> {
    if s.peek() != Some(b'[') {
        s.skip_value(1)?;
        return Err(Fail::Bad("log_history is not a list".into()));
    }
    // A repeated key replaces the earlier list, as in a Python dict.
    state.train_points.clear();
    state.eval_points.clear();
    state.grad_norm_points.clear();
    state.learning_rate_points.clear();
    state.reward_points.clear();
    state.margin_points.clear();
    state.closed = false;
    s.eat(b'[')?;
    s.ws();
    if s.peek() == Some(b']') {
        s.eat(b']')?;
        return Ok(());
    }
    let mut index = 0usize;
    loop {
        log_entry(s, index, state)?;
        index += 1;
        if s.closes(b']')? {
            return Ok(());
        }
    }
}

fn log_entry(s: &mut Scanner, index: usize, state: &mut TrainerState) -> Parsed<()> {
    if s.peek() != Some(b'{') {
        s.skip_value(2)?;
        return Err(Fail::Bad(format!("log_history[{index}] is not an object")));
    }
    let (mut step, mut loss, mut eval_loss) = (None, None, None);
    let (mut grad_norm, mut learning_rate, mut reward) = (None, None, None);
    let mut margin = None;
    members(s, |s, name| {
        match name {
            "train_runtime" => {
                state.closed = true;
                s.skip_value(3)?;
            }
            "reward" => reward = Some(s.scalar()?),
            "rewards/margins" => margin = Some(s.scalar()?),
            "step" => step = Some(s.scalar()?),
            "loss" => loss = Some(s.scalar()?),
            "eval_loss" => eval_loss = Some(s.scalar()?),
            "grad_norm" => grad_norm = Some(s.scalar()?),
            "learning_rate" => learning_rate = Some(s.scalar()?),
            _ => s.skip_value(3)?,
        }
        Ok(())
    })?;
    let Some(step) = step else {
        return Ok(());
    };
    let what = |key: &str| format!("log_history[{index}].{key}");
    if let Some(loss) = loss {
        let step = integer(&step, &what("step"))?;
        state
            .train_points
            .push((step, number(&loss, &what("loss"))?));
        // Side values of a training entry: a null or odd one is left out
        // rather than failing the loss curve it came with.
        if let Some(v) = grad_norm.as_ref().and_then(to_loss) {
            state.grad_norm_points.push((step, v));
        }
        if let Some(v) = learning_rate.as_ref().and_then(to_loss) {
            state.learning_rate_points.push((step, v));
        }
        if let Some(v) = margin.as_ref().and_then(to_loss) {
            state.margin_points.push((step, v));
        }
    }
    if let Some(v) = reward.as_ref().and_then(to_loss) {
        state
            .reward_points
            .push((integer(&step, &what("step"))?, v));
    }
    if let Some(eval_loss) = eval_loss {
        state.eval_points.push((
            integer(&step, &what("step"))?,
            number(&eval_loss, &what("eval_loss"))?,
        ));
    }
    Ok(())
}

/// Where `push_to_hub(hub_strategy="checkpoint")` keeps the newest
/// checkpoint, beside (or instead of) the `checkpoint-<step>/` directories.
pub const LAST_CHECKPOINT: &str = "last-checkpoint";

/// The step of an HF checkpoint directory called `name` (at `dir`), to
/// order checkpoints by: `N` of `checkpoint-N`, compared as a number; for
/// `last-checkpoint`, the `global_step` of its `trainer_state.json`, or
/// `u64::MAX` (the newest) when that cannot be read. None for other names.
/// Where steps tie, `last-checkpoint` is the newer (it is a copy of the
/// newest save).
pub fn checkpoint_dir_step(name: &str, dir: &Path) -> Option<u64> {
    if name == LAST_CHECKPOINT {
        let state = read_trainer_state(&dir.join("trainer_state.json")).ok();
        let step = state.and_then(|s| u64::try_from(s.global_step).ok());
        return Some(step.unwrap_or(u64::MAX));
    }
    numbered_checkpoint_step(name)
}

/// `N` of a folder called `checkpoint-N` (digits only); None for any
/// other name. Reads nothing, unlike [`checkpoint_dir_step`].
pub fn numbered_checkpoint_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("rust/testdata/logs")
            .join(rel)
    }

    /// `[[step, "repr"], ...]` from a sidecar written by the generator.
    fn sidecar_points(v: &serde_json::Value) -> Vec<(i64, f64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let step = p[0].as_i64().unwrap();
                (step, p[1].as_str().unwrap().parse::<f64>().unwrap())
            })
            .collect()
    }

    /// Equal as bits, so NaN == NaN and 0.1 must be exactly 0.1.
    fn same_points(a: &[(i64, f64)], b: &[(i64, f64)]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
    }

    fn parse_err(text: &str) -> String {
        parse_trainer_state(text).unwrap_err()
    }

    #[test]
    fn dpos_margins_are_read_beside_the_loss() {
        let text = r#"{"global_step": 2, "log_history": [
            {"step": 1, "loss": 0.6931, "rewards/margins": 0.0, "rewards/chosen": 0.0},
            {"step": 2, "loss": 0.4, "rewards/margins": 1.5},
            {"step": 3, "eval_loss": 0.5, "eval_rewards/margins": 9.0}
        ]}"#;
        let state = parse_trainer_state(text).unwrap();
        assert_eq!(state.margin_points, vec![(1, 0.0), (2, 1.5)]);
        assert!(!state.closed);
        let closed = r#"{"global_step": 2, "log_history": [
            {"step": 2, "loss": 0.4},
            {"step": 2, "train_runtime": 12.5, "train_loss": 0.5}
        ]}"#;
        assert!(parse_trainer_state(closed).unwrap().closed);
    }

    #[test]
    fn trls_reward_is_read_beside_the_loss() {
        // GRPO's entries: loss near 0, the mean reward, and its parts.
        let text = r#"{"global_step": 3, "log_history": [
            {"step": 1, "loss": 0.0, "reward": 0.25, "rewards/format/mean": 1.0},
            {"step": 2, "loss": 0.0001, "reward": NaN},
            {"step": 3, "loss": 0.0, "reward": null},
            {"step": 3, "eval_loss": 1.0}
        ]}"#;
        let state = parse_trainer_state(text).unwrap();
        assert_eq!(state.reward_points.len(), 2, "{:?}", state.reward_points);
        assert_eq!(state.reward_points[0], (1, 0.25));
        assert!(state.reward_points[1].1.is_nan());
        assert_eq!(state.train_points.len(), 3);
    }

    #[test]
    fn matches_python_json_loads_on_real_trainer_output() {
        for rel in ["hf_run", "hf_run/checkpoint-20"] {
            let state = read_trainer_state(&fixture(&format!("{rel}/trainer_state.json"))).unwrap();
            let text =
                std::fs::read_to_string(fixture(&format!("{rel}/trainer_state.expected.json")))
                    .unwrap();
            let want: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                state.global_step,
                want["global_step"].as_i64().unwrap(),
                "{rel}"
            );
            assert_eq!(state.max_steps, want["max_steps"].as_i64(), "{rel}");
            assert_eq!(state.logging_steps, want["logging_steps"].as_i64(), "{rel}");
            let epoch: f64 = want["epoch"].as_str().unwrap().parse().unwrap();
            assert_eq!(state.epoch, Some(epoch), "{rel}");
            let train = sidecar_points(&want["train_points"]);
            let eval = sidecar_points(&want["eval_points"]);
            assert!(
                same_points(&state.train_points, &train),
                "{rel}: {:?}",
                state.train_points
            );
            assert!(
                same_points(&state.eval_points, &eval),
                "{rel}: {:?}",
                state.eval_points
            );
            assert!(!train.is_empty() && !eval.is_empty());
        }
        // The generator made step 27 diverge: Infinity there, NaN after it.
        let state = read_trainer_state(&fixture("hf_run/trainer_state.json")).unwrap();
        let at = |step: i64| state.train_points.iter().find(|p| p.0 == step).unwrap().1;
        assert_eq!(at(27), f64::INFINITY);
        assert!(at(28).is_nan() && at(30).is_nan());
        assert!(at(26).is_finite());
        assert_eq!(state.train_points.len(), 30);
    }

    #[test]
    fn python_dialect_and_dict_semantics() {
        let state = parse_trainer_state(
            r#"{"global_step": 3, "epoch": null, "log_history": [
                {"step": 1, "loss": -Infinity},
                {"loss": 2.0},
                {"step": 2.0, "lo\u0073s": "1.5", "loss": 1.25, "nested": {"loss": [1, {"a": NaN}]}},
                {"step": 3, "eval_loss": 0.5, "epoch": 1.0}
              ], "log_history_extra": 1, "max_steps": null}"#,
        )
        .unwrap();
        assert_eq!(state.global_step, 3);
        assert_eq!(state.epoch, None);
        assert_eq!(state.max_steps, None);
        assert_eq!(state.logging_steps, None);
        assert_eq!(state.train_points, vec![(1, f64::NEG_INFINITY), (2, 1.25)]);
        assert_eq!(state.eval_points, vec![(3, 0.5)]);
        // A repeated log_history replaces the first one.
        let state = parse_trainer_state(
            r#"{"log_history": [{"step": 1, "loss": 1}], "global_step": 1,
                "log_history": [{"step": 9, "loss": 9}]}"#,
        )
        .unwrap();
        assert_eq!(state.train_points, vec![(9, 9.0)]);
    }

    #[test]
    fn wrong_shapes_are_clear_errors() {
        let cases = [
            ("[1, 2]", "top level is not a JSON object"),
            ("\"text\"", "top level is not a JSON object"),
            (r#"{"global_step": 1}"#, "no log_history"),
            (r#"{"log_history": []}"#, "no global_step"),
            (
                r#"{"global_step": null, "log_history": []}"#,
                "no global_step",
            ),
            (
                r#"{"global_step": "ten", "log_history": []}"#,
                "global_step is a string",
            ),
            (
                r#"{"global_step": [1], "log_history": []}"#,
                "global_step is null, a list",
            ),
            (
                r#"{"global_step": 1, "epoch": {}, "log_history": []}"#,
                "epoch is null, a list",
            ),
            (
                r#"{"global_step": 1, "log_history": 5}"#,
                "log_history is not a list",
            ),
            (
                r#"{"global_step": 1, "log_history": {"step": 1}}"#,
                "log_history is not a list",
            ),
            (
                r#"{"global_step": 1, "log_history": [{}, 3]}"#,
                "log_history[1] is not an object",
            ),
            (
                r#"{"global_step": 1, "log_history": [{"step": 1, "loss": "abc"}]}"#,
                "log_history[0].loss is a string",
            ),
            (
                r#"{"global_step": 1, "log_history": [{"step": null, "loss": 1}]}"#,
                "log_history[0].step is null",
            ),
            (
                r#"{"global_step": 1, "log_history": [{"step": 1e300, "loss": 1}]}"#,
                "log_history[0].step is a number out of range",
            ),
            (
                r#"{"global_step": 1, "log_history": [{"step": 1, "eval_loss": true}]}"#,
                "",
            ),
        ];
        for (text, want) in cases {
            match parse_trainer_state(text) {
                Err(e) => assert!(e.contains(want), "{text}: {e}"),
                // Python's float(True) is 1.0: a boolean eval_loss converts.
                Ok(state) => assert_eq!((want, state.eval_points), ("", vec![(1, 1.0)])),
            }
        }
    }

    #[test]
    fn broken_json_is_located() {
        assert!(parse_err(r#"{"global_step": 1, "log_history": [}"#).contains("line 1, column 36"));
        assert!(parse_err("{\n  \"global_step\": 01\n}").contains("line 2"));
        assert!(parse_err(r#"{"global_step": 1, "log_history": []} x"#).contains("invalid JSON"));
        assert!(
            parse_err(r#"{"global_step": 1, "log_history": [{"step": NaNa}]}"#)
                .contains("invalid JSON")
        );
        assert!(parse_err("{\"a\": \"\t\"}").contains("invalid JSON"));
        assert!(parse_err("{\"é\": é}").contains("invalid JSON at line 1, column 8"));
        assert!(parse_err("{\"é").contains("ends early"));
        assert!(parse_err("").contains("ends early"));
        assert!(parse_err("   ").contains("ends early"));
    }

    #[test]
    fn every_truncation_of_a_real_file_is_an_error_not_a_panic() {
        let text = std::fs::read_to_string(fixture("hf_run/trainer_state.json")).unwrap();
        let trimmed = text.trim_end();
        for cut in (0..trimmed.len()).filter(|&c| text.is_char_boundary(c)) {
            let e = parse_err(&text[..cut]);
            assert!(
                e.contains("ends early") || e.contains("invalid JSON"),
                "cut {cut}: {e}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack() {
        for open in ["[", "{\"a\":"] {
            let deep = format!(
                r#"{{"global_step": 1, "log_history": [{{"step": 1, "x": {}}}]}}"#,
                open.repeat(200_000)
            );
            assert!(parse_err(&deep).contains("nested deeper"), "{open}");
            let deep_top = format!(r#"{{"global_step": {}}}"#, open.repeat(200_000));
            assert!(parse_err(&deep_top).contains("nested deeper"), "{open}");
        }
        // Deep but within the bound is fine.
        let ok = format!(
            r#"{{"global_step": 1, "x": {}1{}, "log_history": []}}"#,
            "[".repeat(400),
            "]".repeat(400)
        );
        assert!(parse_trainer_state(&ok).is_ok());
    }

    #[test]
    fn hostile_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainer_state.json");
        let mut bytes = std::fs::read(fixture("hf_run/trainer_state.json")).unwrap();
        let quote = bytes.iter().position(|&c| c == b'"').unwrap();
        bytes.insert(quote + 1, 0xff);
        std::fs::write(&path, &bytes).unwrap();
        let e = read_trainer_state(&path).unwrap_err();
        assert_eq!(e.area, Area::LogFormat);
        assert_eq!(e.path, path);
        assert!(e.message.contains("not UTF-8"), "{e}");

        // A sparse file past the cap is refused before anything is allocated.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_TRAINER_STATE_BYTES + 1).unwrap();
        let e = read_trainer_state(&path).unwrap_err();
        assert!(e.message.contains("larger than 512 MiB"), "{e}");

        let e = read_trainer_state(&dir.path().join("missing.json")).unwrap_err();
        assert_eq!(e.area, Area::Missing);
        let e = read_trainer_state(dir.path()).unwrap_err();
        assert!(e.message.contains("directory"), "{e}");
    }
}
