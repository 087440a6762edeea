//! A small JSON reader and writer for the channel's frames.
//!
//! Strings are bytes: Python's `json.dumps` escapes a file name that is not UTF-8 with lone
//! surrogates (`\udcXX`, its "surrogateescape" of byte XX), and this module maps them back to
//! the byte and writes such bytes the same way, so paths round-trip exactly as with agent.py.

use std::fmt::Write as _;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Arr(Vec<Value>),
    Obj(Vec<(Vec<u8>, Value)>),
}

impl Value {
    /// The member `key` of an object (None for a missing key or a non-object).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Obj(m) => m.iter().find(|(k, _)| k == key.as_bytes()).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Like Python's `req.get(key)` being truthy: missing, null, false, 0, "" and empty count as absent.
    pub fn get_truthy(&self, key: &str) -> Option<&Value> {
        self.get(key).filter(|v| v.truthy())
    }

    pub fn truthy(&self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Arr(a) => !a.is_empty(),
            Value::Obj(o) => !o.is_empty(),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Bool(b) => Some(*b as i64 as f64),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn str(s: &str) -> Value {
        Value::Str(s.as_bytes().to_vec())
    }
}

/// An object built in insertion order.
#[derive(Default)]
pub struct ObjBuilder(pub Vec<(Vec<u8>, Value)>);

impl ObjBuilder {
    pub fn new() -> Self {
        ObjBuilder(Vec::new())
    }

    pub fn set(&mut self, key: &str, v: Value) -> &mut Self {
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| k == key.as_bytes()) {
            slot.1 = v;
        } else {
            self.0.push((key.as_bytes().to_vec(), v));
        }
        self
    }

    pub fn with(mut self, key: &str, v: Value) -> Self {
        self.set(key, v);
        self
    }

    pub fn build(self) -> Value {
        Value::Obj(self.0)
    }
}

const MAX_DEPTH: usize = 256;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

pub fn parse(text: &[u8]) -> Result<Value, String> {
    let mut p = Parser { s: text, i: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("extra data at byte {}", p.i));
    }
    Ok(v)
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{} at byte {}", what, self.i))
    }

    fn lit(&mut self, word: &[u8], v: Value) -> Result<Value, String> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(v)
        } else {
            self.err("invalid literal")
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return self.err("nested too deeply");
        }
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => {
                self.i += 1;
                let mut members = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Value::Obj(members));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err("expected a string key");
                    }
                    let k = self.string()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return self.err("expected ':'");
                    }
                    self.i += 1;
                    self.ws();
                    let v = self.value(depth + 1)?;
                    // Python keeps the last of duplicate keys.
                    if let Some(slot) = members.iter_mut().find(|(mk, _): &&mut (Vec<u8>, Value)| *mk == k) {
                        slot.1 = v;
                    } else {
                        members.push((k, v));
                    }
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Value::Obj(members));
                        }
                        _ => return self.err("expected ',' or '}'"),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Value::Arr(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Value::Arr(items));
                        }
                        _ => return self.err("expected ',' or ']'"),
                    }
                }
            }
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.lit(b"true", Value::Bool(true)),
            Some(b'f') => self.lit(b"false", Value::Bool(false)),
            Some(b'n') => self.lit(b"null", Value::Null),
            Some(b'N') => self.lit(b"NaN", Value::Float(f64::NAN)),
            Some(b'I') => self.lit(b"Infinity", Value::Float(f64::INFINITY)),
            Some(b'-') if self.s[self.i..].starts_with(b"-Infinity") => {
                self.i += 9;
                Ok(Value::Float(f64::NEG_INFINITY))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => self.err("unexpected character"),
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.i;
        let mut float = false;
        if self.s[self.i] == b'-' {
            self.i += 1;
        }
        let digits = self.i;
        while self.i < self.s.len() {
            match self.s[self.i] {
                b'0'..=b'9' => {}
                b'.' | b'e' | b'E' | b'+' | b'-' => float = true,
                _ => break,
            }
            self.i += 1;
        }
        if self.i == digits {
            return self.err("invalid number");
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
        if !float {
            if let Ok(n) = text.parse::<i64>() {
                return Ok(Value::Int(n));
            }
        }
        text.parse::<f64>().map(Value::Float).map_err(|_| format!("invalid number {:?}", text))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        if self.i + 4 > self.s.len() {
            return self.err("truncated \\u escape");
        }
        let h = std::str::from_utf8(&self.s[self.i..self.i + 4]).map_err(|e| e.to_string())?;
        let v = u32::from_str_radix(h, 16).map_err(|_| format!("invalid \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<Vec<u8>, String> {
        self.i += 1; // the opening quote
        let mut out = Vec::new();
        loop {
            // Copy the run up to the next quote or backslash in one go.
            let run = self.s[self.i..].iter().position(|&c| c == b'"' || c == b'\\');
            let Some(run) = run else { return self.err("unterminated string") };
            out.extend_from_slice(&self.s[self.i..self.i + run]);
            self.i += run;
            let c = self.s[self.i];
            self.i += 1;
            if c == b'"' {
                return Ok(out);
            }
            let Some(&e) = self.s.get(self.i) else { return self.err("unterminated escape") };
            self.i += 1;
            match e {
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'/' => out.push(b'/'),
                b'b' => out.push(8),
                b'f' => out.push(12),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'u' => {
                    let mut cp = self.hex4()?;
                    if (0xD800..0xDC00).contains(&cp) && self.s[self.i..].starts_with(b"\\u") {
                        let save = self.i;
                        self.i += 2;
                        let lo = self.hex4()?;
                        if (0xDC00..0xE000).contains(&lo) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        } else {
                            self.i = save;
                        }
                    }
                    if (0xDC80..0xDD00).contains(&cp) {
                        out.push((cp - 0xDC00) as u8); // surrogateescape: the raw byte
                    } else if let Some(ch) = char::from_u32(cp) {
                        let mut b = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                    } else {
                        // Another lone surrogate: its generalised UTF-8 form (no valid path has it).
                        out.extend_from_slice(&[0xE0 | (cp >> 12) as u8, 0x80 | ((cp >> 6) & 0x3F) as u8, 0x80 | (cp & 0x3F) as u8]);
                    }
                }
                _ => return self.err("invalid escape"),
            }
        }
    }
}

pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for chunk in s.utf8_chunks() {
        for &c in chunk.valid().as_bytes() {
            match c {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0..=0x1f | 0x7f => {
                    let _ = write!(Adapter(out), "\\u{:04x}", c);
                }
                _ => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            let _ = write!(Adapter(out), "\\u{:04x}", 0xDC00 + b as u32);
        }
    }
    out.push(b'"');
}

struct Adapter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Adapter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

pub fn write(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Int(i) => {
            let _ = write!(Adapter(out), "{}", i);
        }
        Value::Float(f) => {
            if f.is_finite() {
                let start = out.len();
                let _ = write!(Adapter(out), "{}", f);
                // Keep it a float on the Python side (`1.0`, not `1`).
                if !out[start..].iter().any(|&c| c == b'.' || c == b'e' || c == b'E') {
                    out.extend_from_slice(b".0");
                }
            } else {
                out.extend_from_slice(b"null");
            }
        }
        Value::Str(s) => write_str(out, s),
        Value::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, item);
            }
            out.push(b']');
        }
        Value::Obj(members) => {
            out.push(b'{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write(out, item);
            }
            out.push(b'}');
        }
    }
}

pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out, v);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request() {
        let v = parse(br#"{"id": 12345678901, "op": "exec", "argv": ["sh", "-c", "echo \"hi\""], "timeout": 1.5,
                          "env": {"A": "b"}, "stdin": null, "x": [true, false, -3, 2e3, {}]}"#).unwrap();
        assert_eq!(v.get("id"), Some(&Value::Int(12345678901)));
        assert_eq!(v.get("op").unwrap().as_bytes(), Some(&b"exec"[..]));
        assert_eq!(v.get("timeout"), Some(&Value::Float(1.5)));
        assert_eq!(v.get("stdin"), Some(&Value::Null));
        assert!(v.get_truthy("stdin").is_none());
        let Some(Value::Arr(argv)) = v.get("argv") else { panic!() };
        assert_eq!(argv[2], Value::str("echo \"hi\""));
        assert_eq!(v.get("env").unwrap().get("A"), Some(&Value::str("b")));
        assert_eq!(v.get("x"), Some(&Value::Arr(vec![Value::Bool(true), Value::Bool(false), Value::Int(-3),
                                                   Value::Float(2000.0), Value::Obj(vec![])])));
    }

    #[test]
    fn unicode_escapes() {
        // BMP, a surrogate pair (U+1F600), and Python's surrogateescape of byte 0xFF.
        let v = parse(br#""\u00e9\u4e2d\ud83d\ude00\udcff\n\t\\\/""#).unwrap();
        let mut want = "é中😀".as_bytes().to_vec();
        want.extend_from_slice(&[0xff, b'\n', b'\t', b'\\', b'/']);
        assert_eq!(v, Value::Str(want));
        // Raw UTF-8 is kept as is.
        assert_eq!(parse("\"é\"".as_bytes()).unwrap(), Value::str("é"));
    }

    #[test]
    fn writes_and_reads_back() {
        let mut s = b"a\"b\\c\n\x01\x7f".to_vec();
        s.extend_from_slice("é".as_bytes());
        s.push(0xfe); // not UTF-8: written as \udcfe, as Python does
        let v = ObjBuilder::new()
            .with("s", Value::Str(s.clone()))
            .with("n", Value::Int(-42))
            .with("f", Value::Float(1.0))
            .with("g", Value::Float(0.000123))
            .with("nan", Value::Float(f64::NAN))
            .with("a", Value::Arr(vec![Value::Null, Value::Bool(true)]))
            .build();
        let text = to_vec(&v);
        let t = String::from_utf8(text.clone()).unwrap();
        assert!(t.contains("\\udcfe"), "{}", t);
        assert!(t.contains("\"f\":1.0"), "{}", t);
        assert!(t.contains("\"nan\":null"), "{}", t);
        let back = parse(&text).unwrap();
        assert_eq!(back.get("s"), Some(&Value::Str(s)));
        assert_eq!(back.get("n"), Some(&Value::Int(-42)));
        assert_eq!(back.get("f"), Some(&Value::Float(1.0)));
        assert_eq!(back.get("g"), Some(&Value::Float(0.000123)));
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [&b""[..], b"{", b"{\"a\"}", b"[1,]", b"\"abc", b"{\"a\":1} x", b"tru", b"-", b"\"\\x\"", b"\"\\u12\""] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "[".repeat(10_000);
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn duplicate_keys_keep_the_last() {
        assert_eq!(parse(br#"{"a":1,"a":2}"#).unwrap().get("a"), Some(&Value::Int(2)));
    }
}
