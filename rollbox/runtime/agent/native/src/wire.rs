//! The channel's JSON frames through serde_json, with strings that are bytes.
//!
//! File names, argv and env are bytes on Linux. Python sends a name that is not UTF-8 as a
//! str with lone surrogates (`os.fsdecode`'s surrogateescape: byte XX is U+DCXX) and its json
//! writes them as `\udcXX` escapes, which serde_json rejects when it makes a `String`. So
//! before parsing, `unlone` rewrites each lone-surrogate escape as escapes of "byte chars",
//! and after serialising, `relone` writes byte chars back as `\udcXX`:
//!
//! * A byte char is U+10FF00 + b for a byte b in 0x80..=0xFF (U+10FF80..U+10FFFF, the end
//!   of plane 16's private use area). In a `String` of this module it stands for the raw
//!   byte b; `to_bytes` and `from_bytes` convert.
//! * A real U+10FF80..U+10FFFF in a frame is split into its four UTF-8 bytes, each a byte
//!   char, so that it round-trips too (as those bytes, which is what `os.fsencode` makes).
//! * Any other lone surrogate becomes the bytes of its generalised UTF-8 form (no valid
//!   path has one; Python's `os.fsencode` would refuse it).
//!
//! Frames are signed over their exact bytes: `to_vec` is called once per frame and those
//! bytes are the ones signed and sent.

pub use serde_json::{Map, Value};

const BYTE_CHAR_BASE: u32 = 0x10FF00;

fn byte_char(b: u8) -> char {
    debug_assert!(b >= 0x80);
    char::from_u32(BYTE_CHAR_BASE + b as u32).unwrap()
}

fn char_byte(c: char) -> Option<u8> {
    let n = c as u32;
    if n >= BYTE_CHAR_BASE + 0x80 {
        Some((n - BYTE_CHAR_BASE) as u8)
    } else {
        None
    }
}

/// The bytes a frame string stands for.
pub fn to_bytes(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match char_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    out
}

/// A frame string for bytes: UTF-8 runs as they are, every other byte (and the bytes of a
/// real U+10FF80..U+10FFFF) as a byte char.
pub fn from_bytes(mut b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    loop {
        let (valid, rest) = match std::str::from_utf8(b) {
            Ok(s) => (s, &b[b.len()..]),
            Err(e) => {
                let (v, r) = b.split_at(e.valid_up_to());
                (std::str::from_utf8(v).unwrap(), r)
            }
        };
        for c in valid.chars() {
            if char_byte(c).is_some() {
                for &x in c.encode_utf8(&mut [0u8; 4]).as_bytes() {
                    out.push(byte_char(x));
                }
            } else {
                out.push(c);
            }
        }
        match rest.first() {
            None => return out,
            Some(&x) => {
                out.push(byte_char(x)); // never ASCII: ASCII is always valid UTF-8
                b = &rest[1..];
            }
        }
    }
}

fn push_escape(out: &mut Vec<u8>, unit: u32) {
    out.extend_from_slice(format!("\\u{:04x}", unit).as_bytes());
}

/// Writes byte b as the escapes of its byte char (a surrogate pair).
fn push_byte_char_escape(out: &mut Vec<u8>, b: u8) {
    let n = BYTE_CHAR_BASE + b as u32 - 0x10000;
    push_escape(out, 0xD800 + (n >> 10));
    push_escape(out, 0xDC00 + (n & 0x3FF));
}

fn hex4(s: &[u8]) -> Option<u32> {
    let h = std::str::from_utf8(s.get(..4)?).ok()?;
    if h.bytes().all(|c| c.is_ascii_hexdigit()) {
        u32::from_str_radix(h, 16).ok()
    } else {
        None
    }
}

/// Rewrites lone-surrogate escapes (and real byte chars) as byte-char escapes; everything
/// else is copied. It only looks at `\u` escapes, which can appear only inside strings.
fn unlone(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let suspicious = |w: &[u8]| (w[0] == b'\\' && w[1] == b'u') || w[0] == 0xF4;
    if !text.windows(2).any(suspicious) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        if c == 0xF4 && text.len() >= i + 4 && text[i + 1] == 0x8F && (text[i + 2] == 0xBE || text[i + 2] == 0xBF) {
            // A raw UTF-8 U+10FF80..U+10FFFF: its four bytes.
            for &x in &text[i..i + 4] {
                push_byte_char_escape(&mut out, x);
            }
            i += 4;
            continue;
        }
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        if text.get(i + 1) != Some(&b'u') {
            // Another escape (\\, \", \n ...): copied whole, so `\\u` is never read as `\u`.
            out.extend_from_slice(&text[i..(i + 2).min(text.len())]);
            i += 2;
            continue;
        }
        let unit = match hex4(&text[i + 2..]) {
            Some(u) => u,
            None => {
                out.extend_from_slice(&text[i..i + 2]); // malformed: serde_json reports it
                i += 2;
                continue;
            }
        };
        if !(0xD800..0xE000).contains(&unit) {
            out.extend_from_slice(&text[i..i + 6]);
            i += 6;
            continue;
        }
        if unit < 0xDC00 {
            let low = if text[i + 6..].starts_with(b"\\u") { hex4(&text[i + 8..]) } else { None };
            if let Some(low @ 0xDC00..=0xDFFF) = low {
                let cp = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                if cp >= BYTE_CHAR_BASE + 0x80 {
                    let ch = char::from_u32(cp).unwrap();
                    for &x in ch.encode_utf8(&mut [0u8; 4]).as_bytes() {
                        push_byte_char_escape(&mut out, x);
                    }
                } else {
                    out.extend_from_slice(&text[i..i + 12]);
                }
                i += 12;
                continue;
            }
        }
        // A lone surrogate.
        if (0xDC80..0xDD00).contains(&unit) {
            push_byte_char_escape(&mut out, (unit - 0xDC00) as u8);
        } else {
            for x in [0xE0 | (unit >> 12) as u8, 0x80 | ((unit >> 6) & 0x3F) as u8, 0x80 | (unit & 0x3F) as u8] {
                push_byte_char_escape(&mut out, x);
            }
        }
        i += 6;
    }
    std::borrow::Cow::Owned(out)
}

/// Rewrites the byte chars serde_json wrote (raw UTF-8: it escapes only ASCII controls, `"`
/// and `\`) as `\udcXX`, Python's escape of byte XX.
fn relone(mut text: Vec<u8>) -> Vec<u8> {
    let has = |t: &[u8]| t.windows(3).any(|w| w[0] == 0xF4 && w[1] == 0x8F && (w[2] == 0xBE || w[2] == 0xBF));
    if !has(&text) {
        return text;
    }
    let src = std::mem::take(&mut text);
    let mut i = 0;
    while i < src.len() {
        if src[i] == 0xF4 && i + 3 < src.len() && src[i + 1] == 0x8F && (src[i + 2] == 0xBE || src[i + 2] == 0xBF) {
            let b = 0x80 | ((src[i + 2] & 1) << 6) | (src[i + 3] & 0x3F);
            push_escape(&mut text, 0xDC00 + b as u32);
            i += 4;
        } else {
            text.push(src[i]);
            i += 1;
        }
    }
    text
}

/// Parses one frame's JSON (Python's `json.loads`: duplicate keys keep the last, NaN and
/// Infinity excepted, which the daemon never sends).
pub fn parse(text: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(&unlone(text)).map_err(|e| e.to_string())
}

/// The JSON text of a frame, byte chars as `\udcXX`. Non-finite floats are already null in
/// a `Value` (serde_json makes them so), as agent.py's replies never carry them either.
pub fn to_vec(v: &Value) -> Vec<u8> {
    relone(serde_json::to_vec(v).expect("a Value always serialises"))
}

/// Like Python's `bool(x)`: null, false, 0, "", [] and {} are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().map(|f| f != 0.0).unwrap_or(true),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Like Python's `req.get(key)` being truthy: missing and false-like values are None.
pub fn get_truthy<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| truthy(x))
}

/// A number as Python sees one (bools are 0 and 1).
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Bool(b) => Some(*b as i64 as f64),
        _ => v.as_f64(),
    }
}

/// The bytes of a string value.
pub fn as_bytes(v: &Value) -> Option<Vec<u8>> {
    v.as_str().map(to_bytes)
}

/// A string value for bytes.
pub fn bytes(b: &[u8]) -> Value {
    Value::String(from_bytes(b))
}

/// The base64 fields of frames (file contents, stdin, output): base64's STANDARD alphabet
/// with padding, as Python's `base64.b64encode`.
pub fn b64encode(data: &[u8]) -> Value {
    Value::String(base64::encode(data))
}

pub fn b64decode(v: &str) -> Result<Vec<u8>, String> {
    base64::decode(v).map_err(|e| format!("invalid base64: {}", e))
}

/// Python's views of a request value, as the ops read them.
pub trait ValueExt {
    /// Like `req.get(key)` being truthy: missing and false-like values are None.
    fn get_truthy(&self, key: &str) -> Option<&Value>;
    /// A number as Python sees one (bools are 0 and 1).
    fn num(&self) -> Option<f64>;
    /// The bytes of a string value (byte chars as their bytes).
    fn bytes(&self) -> Option<Vec<u8>>;
}

impl ValueExt for Value {
    fn get_truthy(&self, key: &str) -> Option<&Value> {
        get_truthy(self, key)
    }
    fn num(&self) -> Option<f64> {
        as_f64(self)
    }
    fn bytes(&self) -> Option<Vec<u8>> {
        as_bytes(self)
    }
}

/// A reply object, built in steps.
#[derive(Default)]
pub struct Obj(pub Map<String, Value>);

impl Obj {
    pub fn new() -> Self {
        Obj(Map::new())
    }

    pub fn set(&mut self, key: &str, v: Value) -> &mut Self {
        self.0.insert(key.to_string(), v);
        self
    }

    pub fn with(mut self, key: &str, v: Value) -> Self {
        self.set(key, v);
        self
    }

    pub fn build(self) -> Value {
        Value::Object(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request() {
        let v = parse(br#"{"id": 12345678901, "op": "exec", "argv": ["sh", "-c", "echo \"hi\""], "timeout": 1.5,
                          "env": {"A": "b"}, "stdin": null, "x": [true, false, -3, 2e3, {}]}"#).unwrap();
        assert_eq!(v["id"].as_i64(), Some(12345678901));
        assert_eq!(as_bytes(&v["op"]), Some(b"exec".to_vec()));
        assert_eq!(v["timeout"].as_f64(), Some(1.5));
        assert!(get_truthy(&v, "stdin").is_none());
        assert_eq!(v["argv"][2], Value::from("echo \"hi\""));
        assert_eq!(v["env"]["A"], Value::from("b"));
        assert_eq!(as_f64(&v["x"][3]), Some(2000.0));
    }

    #[test]
    fn python_surrogate_escapes_are_bytes() {
        // What Python's json.dumps({"p": os.fsdecode(b"caf\xe9/\xff"), ...}) sends: lone
        // surrogates, next to a real pair (U+1F600), BMP text and other escapes.
        let v = parse(br#"{"p":"caf\udce9/\udcff","q":"\u00e9\u4e2d\ud83d\ude00\n\t\\\/","r":"\\udcff"}"#).unwrap();
        assert_eq!(as_bytes(&v["p"]).unwrap(), b"caf\xe9/\xff");
        assert_eq!(as_bytes(&v["q"]).unwrap(), "é中😀\n\t\\/".as_bytes());
        // An escaped backslash before "udcff" is text, not an escape.
        assert_eq!(as_bytes(&v["r"]).unwrap(), b"\\udcff");
    }

    #[test]
    fn bytes_round_trip_exactly() {
        let mut cases: Vec<Vec<u8>> = vec![
            b"plain".to_vec(),
            b"caf\xe9".to_vec(),
            b"\xff\xfe\x80".to_vec(),
            b"a\"b\\c\n\x01\x7f".to_vec(),
            "é中😀".as_bytes().to_vec(),
            "\u{10FF80}x\u{10FFFF}".as_bytes().to_vec(), // real byte-char code points
            b"\xf4\x8f\xbe".to_vec(),                    // a truncated one
            b"\xed\xb3\xbf".to_vec(),                    // a surrogate's generalised UTF-8
        ];
        cases.push((0u8..=255).collect());
        for b in cases {
            let text = to_vec(&Obj::new().with("s", bytes(&b)).build());
            // What Python reads is ASCII-or-UTF-8 JSON with \udcXX for the odd bytes...
            assert!(std::str::from_utf8(&text).is_ok(), "{:?}", text);
            assert!(!text.windows(2).any(|w| w == [0xF4, 0x8F]), "{:?}", String::from_utf8_lossy(&text));
            // ...and reading it back gives the same bytes.
            assert_eq!(as_bytes(&parse(&text).unwrap()["s"]).unwrap(), b);
        }
    }

    #[test]
    fn writes_what_python_writes() {
        let text = to_vec(&Obj::new().with("s", bytes(b"f\xff")).with("f", Value::from(1.0)).build());
        let t = String::from_utf8(text).unwrap();
        assert!(t.contains(r#""s":"f\udcff""#), "{}", t);
        assert!(t.contains(r#""f":1.0"#), "{}", t);
        assert_eq!(to_vec(&Value::from(f64::NAN)), b"null");
    }

    #[test]
    fn real_byte_chars_from_python_are_their_utf8_bytes() {
        // json.dumps("\U0010ff80") (ensure_ascii) and its raw UTF-8 form.
        assert_eq!(as_bytes(&parse(br#""\udbff\udf80""#).unwrap()).unwrap(), "\u{10FF80}".as_bytes());
        assert_eq!(as_bytes(&parse("\"\u{10FFFF}\"".as_bytes()).unwrap()).unwrap(), "\u{10FFFF}".as_bytes());
        // Other lone surrogates: their generalised UTF-8, as the agent always did.
        assert_eq!(as_bytes(&parse(br#""\ud800x\udc41""#).unwrap()).unwrap(), b"\xed\xa0\x80x\xed\xb1\x81");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [&b""[..], b"{", b"{\"a\"}", b"[1,]", b"\"abc", b"{\"a\":1} x", b"tru", b"-", b"\"\\x\"", b"\"\\u12\"",
                    b"\"\\u12", b"\"\\"] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "[".repeat(10_000);
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn duplicate_keys_keep_the_last() {
        assert_eq!(parse(br#"{"a":1,"a":2}"#).unwrap()["a"].as_i64(), Some(2));
    }
}
