//! Classify one dlm log line the way `json.loads` + the drift probe would.
//!
//! A line is a step only when it is a complete, valid JSON document (Python's
//! dialect: `NaN`/`Infinity`/`-Infinity` allowed, strict strings) whose
//! top-level object has `"type": "step"`. Only the three keys we need are
//! decoded; every other value is validated and skipped without allocation.
//! Duplicate keys resolve to the last occurrence, as in a Python dict.
//!
//! The scanner and the `int()`/`float()` conversions are `pub(crate)`: the
//! `trainer_state.json` and `metrics.csv` readers use the same dialect.

/// What a line means for the loss curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LineKind {
    /// Not a JSON document at all (torn, garbage, bad UTF-8).
    Invalid,
    /// Valid JSON that is not a usable step record.
    Other,
    /// A step record: (step, loss).
    Step(i64, f64),
}

/// Deepest nesting accepted; deeper documents are treated as unreadable
/// (Python's own parser gives up near its recursion limit too).
pub(crate) const MAX_DEPTH: usize = 512;

/// A top-level value of one of the keys we care about.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar<'a> {
    /// Number text, already checked against the JSON grammar.
    Number(&'a str),
    NaN,
    PosInf,
    NegInf,
    /// String contents with escapes decoded (lone surrogates become U+FFFD).
    Str(std::borrow::Cow<'a, str>),
    Bool(bool),
    /// null, an array or an object: never a usable step or loss.
    Unusable,
}

const PLAIN: u8 = 0;
const QUOTE: u8 = 1;
const BACKSLASH: u8 = 2;
const CONTROL: u8 = 3;
const HIGH: u8 = 4;

/// How a byte behaves inside a JSON string.
static STRING_CLASS: [u8; 256] = {
    let mut t = [PLAIN; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = match i {
            0x00..=0x1f => CONTROL,
            0x22 => QUOTE,
            0x5c => BACKSLASH,
            0x80..=0xff => HIGH,
            _ => PLAIN,
        };
        i += 1;
    }
    t
};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Byte lanes of `w` equal to `byte`, flagged in their high bit (the lowest
/// flag is exact; flags above it may be spurious, so only it is used).
#[inline]
fn lanes_eq(w: u64, byte: u8) -> u64 {
    let x = w ^ (ONES * byte as u64);
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// Length of the leading run of plain string bytes (not `"`, `\\`, a control
/// character or a non-ASCII byte), eight bytes at a time.
#[inline]
fn plain_run(b: &[u8]) -> usize {
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
        let special = lanes_eq(w, b'"') | lanes_eq(w, b'\\') | control | (w & HIGHS);
        if special != 0 {
            return i + (special.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + b[i..]
        .iter()
        .position(|&c| STRING_CLASS[c as usize] != PLAIN)
        .unwrap_or(b.len() - i)
}

/// Length of the leading run of ASCII digits, eight bytes at a time.
#[inline]
fn digit_run(b: &[u8]) -> usize {
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        // A lane is not a digit when it is below '0' (the subtraction
        // borrows), above '9' (adding 0x46 reaches 0x80) or non-ASCII.
        let below = w.wrapping_sub(ONES * 0x30) & !w & HIGHS;
        let above = w.wrapping_add(ONES * 0x46) & HIGHS;
        let other = below | above | (w & HIGHS);
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + b[i..]
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(b.len() - i)
}

/// The top-level keys that matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Type,
    Step,
    Loss,
    ValLoss,
    GradNorm,
    Lr,
    Other,
}

impl Field {
    #[inline]
    fn of(key: &[u8]) -> Field {
        match key {
            b"type" => Field::Type,
            b"step" => Field::Step,
            b"loss" => Field::Loss,
            b"val_loss" => Field::ValLoss,
            b"grad_norm" => Field::GradNorm,
            b"lr" => Field::Lr,
            _ => Field::Other,
        }
    }
}

pub(crate) struct Scanner<'a> {
    /// The line, known to be valid UTF-8 (`s` is the same text).
    b: &'a [u8],
    s: &'a str,
    /// Offset of the next byte to read.
    pub(crate) i: usize,
    /// Set when a value nested deeper than `MAX_DEPTH` stopped the scan.
    pub(crate) too_deep: bool,
}

pub(crate) type Parse<T> = Result<T, ()>;

impl<'a> Scanner<'a> {
    /// A scanner over a whole document (or line) of text.
    pub(crate) fn new(text: &'a str) -> Self {
        Scanner {
            b: text.as_bytes(),
            s: text,
            i: 0,
            too_deep: false,
        }
    }

    #[inline]
    pub(crate) fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    pub(crate) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    #[inline]
    pub(crate) fn eat(&mut self, c: u8) -> Parse<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(())
        }
    }

    pub(crate) fn literal(&mut self, word: &[u8]) -> Parse<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(())
        }
    }

    /// Scan a string body after the opening quote; returns the raw bytes
    /// between the quotes and whether it holds escapes.
    #[inline]
    pub(crate) fn string_raw(&mut self) -> Parse<(&'a [u8], bool)> {
        let start = self.i;
        let mut escaped = false;
        loop {
            // Plain bytes are the common case: skip them a word at a time.
            self.i += plain_run(self.b.get(self.i..).unwrap_or_default());
            let c = *self.b.get(self.i).ok_or(())?;
            match STRING_CLASS[c as usize] {
                QUOTE => break,
                BACKSLASH => {
                    escaped = true;
                    let e = *self.b.get(self.i + 1).ok_or(())?;
                    match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6).ok_or(())?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(());
                            }
                            self.i += 6;
                        }
                        _ => return Err(()),
                    }
                }
                // The whole line is valid UTF-8: non-ASCII bytes are text.
                HIGH => self.i += 1,
                _ => return Err(()), // a raw control character
            }
        }
        let raw = &self.b[start..self.i];
        self.i += 1; // closing quote
        Ok((raw, escaped))
    }

    fn string(&mut self) -> Parse<std::borrow::Cow<'a, str>> {
        let (raw, escaped) = self.string_raw()?;
        if !escaped {
            // Validated as UTF-8 (or pure ASCII) by string_raw.
            return std::str::from_utf8(raw).map(Into::into).map_err(|_| ());
        }
        Ok(unescape(raw).into())
    }

    /// Whether the string equals `want` (escapes decoded only when present).
    #[inline]
    fn string_eq(&mut self, want: &[u8]) -> Parse<bool> {
        let (raw, escaped) = self.string_raw()?;
        Ok(if escaped {
            unescape(raw).as_bytes() == want
        } else {
            raw == want
        })
    }

    /// Check a number against JSON's grammar; returns its text.
    fn number(&mut self) -> Parse<&'a str> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(()),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(());
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(());
            }
            self.digits();
        }
        // Only ASCII bytes were consumed, so both ends are char boundaries.
        self.s.get(start..self.i).ok_or(())
    }

    #[inline]
    fn digits(&mut self) {
        self.i += digit_run(self.b.get(self.i..).unwrap_or_default());
    }

    /// Parse a value we care about.
    pub(crate) fn scalar(&mut self) -> Parse<Scalar<'a>> {
        Ok(match self.peek().ok_or(())? {
            b'"' => {
                self.i += 1;
                Scalar::Str(self.string()?)
            }
            b't' => {
                self.literal(b"true")?;
                Scalar::Bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                Scalar::Bool(false)
            }
            b'N' => {
                self.literal(b"NaN")?;
                Scalar::NaN
            }
            b'I' => {
                self.literal(b"Infinity")?;
                Scalar::PosInf
            }
            b'-' if self.b[self.i..].starts_with(b"-Infinity") => {
                self.i += 9;
                Scalar::NegInf
            }
            b'-' | b'0'..=b'9' => Scalar::Number(self.number()?),
            b'{' | b'[' | b'n' => {
                self.skip_value(1)?;
                Scalar::Unusable
            }
            _ => return Err(()),
        })
    }

    /// After a container item: true at `close` (consumed), false after a
    /// comma (consumed, whitespace skipped); anything else is an error.
    #[inline]
    pub(crate) fn closes(&mut self, close: u8) -> Parse<bool> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                self.ws();
                Ok(false)
            }
            Some(c) if c == close => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(()),
        }
    }

    /// Validate and skip any value.
    pub(crate) fn skip_value(&mut self, depth: usize) -> Parse<()> {
        if depth > MAX_DEPTH {
            self.too_deep = true;
            return Err(());
        }
        match self.peek().ok_or(())? {
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.eat(b'"')?;
                    self.string_raw()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.skip_value(depth + 1)?;
                    if self.closes(b'}')? {
                        return Ok(());
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip_value(depth + 1)?;
                    if self.closes(b']')? {
                        return Ok(());
                    }
                }
            }
            b'"' => {
                self.i += 1;
                self.string_raw().map(|_| ())
            }
            b'n' => self.literal(b"null"),
            b'0'..=b'9' => self.number().map(|_| ()),
            b't' | b'f' | b'N' | b'I' | b'-' => self.scalar().map(|_| ()),
            _ => Err(()),
        }
    }
}

/// Decode JSON escapes (the input is known to be well formed).
pub(crate) fn unescape(raw: &[u8]) -> String {
    let mut units: Vec<u16> = Vec::with_capacity(raw.len());
    let text = String::from_utf8_lossy(raw);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u16; 2];
            units.extend_from_slice(c.encode_utf16(&mut buf));
            continue;
        }
        let unit = match chars.next() {
            Some('b') => 0x08,
            Some('f') => 0x0c,
            Some('n') => 0x0a,
            Some('r') => 0x0d,
            Some('t') => 0x09,
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                u16::from_str_radix(&hex, 16).unwrap_or(0xfffd)
            }
            Some(other) => other as u16,
            None => 0xfffd,
        };
        units.push(unit);
    }
    String::from_utf16_lossy(&units)
}

/// The step number Python's `int(value)` would give, if it fits in i64.
pub(crate) fn to_step(v: &Scalar) -> Option<i64> {
    match v {
        Scalar::Bool(b) => Some(i64::from(*b)),
        Scalar::Number(text) => {
            if text.bytes().any(|c| matches!(c, b'.' | b'e' | b'E')) {
                float_to_step(text.parse::<f64>().ok()?)
            } else {
                text.parse::<i64>().ok()
            }
        }
        Scalar::Str(s) => python_int(s),
        _ => None,
    }
}

pub(crate) fn float_to_step(x: f64) -> Option<i64> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0; // exactly 2^63
    let t = x.trunc();
    // i64 covers [-2^63, 2^63); NaN and infinities fall outside.
    if (-TWO_63..TWO_63).contains(&t) {
        Some(t as i64)
    } else {
        None
    }
}

/// The loss Python's `float(value)` would give.
pub(crate) fn to_loss(v: &Scalar) -> Option<f64> {
    match v {
        Scalar::Bool(b) => Some(f64::from(u8::from(*b))),
        Scalar::Number(text) => text.parse::<f64>().ok(),
        Scalar::NaN => Some(f64::NAN),
        Scalar::PosInf => Some(f64::INFINITY),
        Scalar::NegInf => Some(f64::NEG_INFINITY),
        Scalar::Str(s) => python_float(s),
        Scalar::Unusable => None,
    }
}

fn strip_py(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

/// Remove underscores that sit between two digits; None if any other does.
fn without_digit_underscores(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let ok =
                i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit);
            if !ok {
                return None;
            }
        } else {
            out.push(c as char);
        }
    }
    Some(out)
}

/// `int(s)` for a decimal string (ASCII digits), if it fits in i64.
pub(crate) fn python_int(s: &str) -> Option<i64> {
    let s = strip_py(s);
    if !s.is_ascii() {
        return None;
    }
    let cleaned = without_digit_underscores(s)?;
    let digits = cleaned.strip_prefix(['+', '-']).unwrap_or(&cleaned);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    cleaned.parse::<i64>().ok()
}

/// `float(s)` for the usual spellings: decimal/exponent forms, inf, nan.
pub(crate) fn python_float(s: &str) -> Option<f64> {
    let s = strip_py(s);
    if !s.is_ascii() {
        return None;
    }
    let cleaned = without_digit_underscores(s)?;
    let body = cleaned.strip_prefix(['+', '-']).unwrap_or(&cleaned);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return cleaned.to_ascii_lowercase().parse::<f64>().ok();
    }
    // Digits with at most one dot, then an optional exponent.
    let (mantissa, exponent) = match lower.find('e') {
        Some(p) => (&lower[..p], Some(&lower[p + 1..])),
        None => (lower.as_str(), None),
    };
    let dots = mantissa.bytes().filter(|&c| c == b'.').count();
    let mant_digits = mantissa.bytes().filter(u8::is_ascii_digit).count();
    if dots > 1 || mant_digits == 0 || mant_digits + dots != mantissa.len() {
        return None;
    }
    if let Some(exp) = exponent {
        let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
        if exp.is_empty() || !exp.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
    }
    cleaned.parse::<f64>().ok()
}

/// What a dlm step line logs beside its loss; None where a key is absent,
/// null or not a number (a NaN stays NaN: it is evidence).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepExtras {
    pub val_loss: Option<f64>,
    pub grad_norm: Option<f64>,
    pub lr: Option<f64>,
}

/// Classify one line (without its line terminator).
pub fn classify(line: &[u8]) -> LineKind {
    classify_step(line).0
}

/// Classify one line and, for a step, read what else it logged.
pub fn classify_step(line: &[u8]) -> (LineKind, StepExtras) {
    match parse_top(line) {
        Ok(Some((step, loss, extras))) => match (to_step(&step), to_loss(&loss)) {
            (Some(s), Some(l)) => (LineKind::Step(s, l), extras),
            _ => (LineKind::Other, StepExtras::default()),
        },
        Ok(None) => (LineKind::Other, StepExtras::default()),
        Err(()) => (LineKind::Invalid, StepExtras::default()),
    }
}

/// Parse a whole document; Some((step, loss, extras)) when it is a step
/// object that has both keys.
fn parse_top(line: &[u8]) -> Parse<Option<(Scalar<'_>, Scalar<'_>, StepExtras)>> {
    let text = std::str::from_utf8(line).map_err(|_| ())?;
    let mut s = Scanner::new(text);
    s.ws();
    if s.peek() != Some(b'{') {
        s.skip_value(0)?;
        s.ws();
        return if s.i == line.len() { Ok(None) } else { Err(()) };
    }
    s.i += 1;
    let (mut kind, mut step, mut loss) = (None, None, None);
    let mut extras = StepExtras::default();
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.eat(b'"')?;
            let (raw, escaped) = s.string_raw()?;
            let field = if escaped {
                Field::of(unescape(raw).as_bytes())
            } else {
                Field::of(raw)
            };
            s.ws();
            s.eat(b':')?;
            s.ws();
            match field {
                Field::Type => {
                    // Only a string equal to "step" matters; anything else is "not step".
                    kind = Some(if s.peek() == Some(b'"') {
                        s.i += 1;
                        s.string_eq(b"step")?
                    } else {
                        s.skip_value(1)?;
                        false
                    });
                }
                Field::Step => step = Some(s.scalar()?),
                Field::Loss => loss = Some(s.scalar()?),
                // A later duplicate key wins, as in a Python dict.
                Field::ValLoss => extras.val_loss = to_loss(&s.scalar()?),
                Field::GradNorm => extras.grad_norm = to_loss(&s.scalar()?),
                Field::Lr => extras.lr = to_loss(&s.scalar()?),
                Field::Other => s.skip_value(1)?,
            }
            if s.closes(b'}')? {
                break;
            }
        }
    }
    s.ws();
    if s.i != line.len() {
        return Err(());
    }
    Ok(match (kind == Some(true), step, loss) {
        (true, Some(st), Some(lo)) => Some((st, lo, extras)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::LineKind::*;
    use super::*;

    fn c(s: &str) -> LineKind {
        classify(s.as_bytes())
    }

    #[test]
    fn dlm_lines() {
        let line = r#"{"grad_norm": null, "loss": 2.5, "lr": 0.0001, "step": 3, "timestamp": "2025-01-01T00:00:00", "tokens_per_sec": 10.0, "type": "step", "val_loss": null}"#;
        assert_eq!(c(line), Step(3, 2.5));
        assert_eq!(
            c(r#"{"type":"step","step":10.0,"loss":NaN}"#).to_string_kind(),
            "step"
        );
        assert!(
            matches!(c(r#"{"type":"step","step":10.0,"loss":NaN}"#), Step(10, l) if l.is_nan())
        );
        assert_eq!(
            c(r#"{"loss": Infinity, "step": 1, "type": "step"}"#),
            Step(1, f64::INFINITY)
        );
        assert_eq!(
            c(r#"{"loss": -Infinity, "step": 1, "type": "step"}"#),
            Step(1, f64::NEG_INFINITY)
        );
        assert_eq!(
            c(r#"{"type": "banner", "plan": {"type": "step", "step": 1, "loss": 1}}"#),
            Other
        );
        assert_eq!(c(r#"{"type": "note", "msg": "\"type\": \"step\""}"#), Other);
        assert_eq!(
            c(r#"{"typ\u0065": "st\u0065p", "step": 2, "loss": 1}"#),
            Step(2, 1.0)
        );
        assert_eq!(
            c(r#"{"type": "step", "step": 2, "loss": 1, "type": "x"}"#),
            Other
        );
        assert_eq!(c(r#"{"type": "step", "step": 2}"#), Other);
        assert_eq!(c(r#"[1, 2]"#), Other);
        assert_eq!(
            c(r#"{"type": "step", "step": 2, "loss": 1}  "#),
            Step(2, 1.0)
        );
    }

    #[test]
    fn python_conversions() {
        assert_eq!(
            c(r#"{"type":"step","step":"12","loss":"1.5"}"#),
            Step(12, 1.5)
        );
        assert_eq!(
            c(r#"{"type":"step","step":" 1_000 ","loss":" 1e3 "}"#),
            Step(1000, 1000.0)
        );
        assert_eq!(
            c(r#"{"type":"step","step":true,"loss":false}"#),
            Step(1, 0.0)
        );
        assert_eq!(c(r#"{"type":"step","step":-7.9,"loss":1}"#), Step(-7, 1.0));
        assert_eq!(c(r#"{"type":"step","step":1e300,"loss":1}"#), Other);
        assert_eq!(c(r#"{"type":"step","step":NaN,"loss":1}"#), Other);
        assert_eq!(c(r#"{"type":"step","step":"1.0","loss":1}"#), Other);
        assert_eq!(c(r#"{"type":"step","step":1,"loss":null}"#), Other);
        assert_eq!(c(r#"{"type":"step","step":1,"loss":[1]}"#), Other);
        assert_eq!(c(r#"{"type":"step","step":1,"loss":"1__0"}"#), Other);
        assert!(matches!(c(r#"{"type":"step","step":1,"loss":"-nan"}"#), Step(1, l) if l.is_nan()));
        assert_eq!(
            c(r#"{"type":"step","step":1,"loss":1e400}"#),
            Step(1, f64::INFINITY)
        );
    }

    #[test]
    fn invalid_documents() {
        for bad in [
            r#"{"loss": 1.5, "step": 1"#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": .5}"#,
            r#"{"a": +1}"#,
            r#"{"a": -NaN}"#,
            r#"{"a": "\x"}"#,
            r#"{"a": "\u12"}"#,
            "{\"a\": \"tab\there\"}",
            r#"{"a": 1} x"#,
            r#"{"a": 1,}"#,
            r#"{a: 1}"#,
            r#"{"a" 1}"#,
            r#"[1,]"#,
            "",
            "nul",
        ] {
            assert_eq!(c(bad), Invalid, "{bad}");
        }
        assert_eq!(classify(b"{\"a\": \"\xff\"}"), Invalid);
        assert_eq!(classify("{\"a\": \"é\"}".as_bytes()), Other);
        let deep = "[".repeat(100_000);
        assert_eq!(c(&deep), Invalid);
    }

    #[test]
    fn word_scans_match_byte_scans() {
        let mut state = 7u64;
        let alphabet = b"09az\"\\\x00\x1f \x7f\x80\xff.-eE+/";
        for len in 0..40 {
            for _ in 0..300 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        // Mostly plain letters/digits so runs get long.
                        let r = (state >> 33) as usize;
                        if r % 4 == 0 {
                            alphabet[r / 4 % alphabet.len()]
                        } else {
                            b"0123456789abcdef"[r % 16]
                        }
                    })
                    .collect();
                let plain = bytes
                    .iter()
                    .position(|&c| STRING_CLASS[c as usize] != PLAIN)
                    .unwrap_or(len);
                let digits = bytes
                    .iter()
                    .position(|c| !c.is_ascii_digit())
                    .unwrap_or(len);
                assert_eq!(plain_run(&bytes), plain, "{bytes:?}");
                assert_eq!(digit_run(&bytes), digits, "{bytes:?}");
            }
        }
    }

    impl LineKind {
        fn to_string_kind(self) -> &'static str {
            match self {
                Invalid => "invalid",
                Other => "other",
                Step(..) => "step",
            }
        }
    }
}
