//! The pickle subset PyTorch memory snapshots use, both ways.
//!
//! The writer emits only opcodes that PyTorch's MemoryViz.js `unpickle()` accepts (protocol 2,
//! dicts, lists, tuples, str, ints as BININT*/8-byte LONG1, floats, bools, None): no bytes, no
//! LONG4, no globals. The reader accepts what `pickle.dump` of such a dict produces under any
//! protocol 2-5 (framing and memo included) and rejects everything else (no GLOBAL/REDUCE: it
//! never runs code).

use std::io::{self, Write};

// Opcodes.
const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const DICT: u8 = b'd';
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const EMPTY_LIST: u8 = b']';
const LIST: u8 = b'l';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const EMPTY_TUPLE: u8 = b')';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';
const BINUNICODE: u8 = b'X';
const SHORT_BINUNICODE: u8 = 0x8c;
const MEMOIZE: u8 = 0x94;
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// A streaming pickle writer. Containers are opened and closed explicitly so that huge lists
/// never sit in memory: `list_begin`, items, `list_end`.
pub struct PickleWriter<W: Write> {
    w: W,
    /// Items since the last MARK, per open container (batched like CPython: 1000 per batch).
    stack: Vec<(u8, usize)>,
}

const BATCH: usize = 1000;

impl<W: Write> PickleWriter<W> {
    pub fn new(mut w: W) -> io::Result<Self> {
        w.write_all(&[PROTO, 2])?;
        Ok(PickleWriter {
            w,
            stack: Vec::new(),
        })
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.w.write_all(&[STOP])?;
        Ok(self.w)
    }

    fn item_done(&mut self) -> io::Result<()> {
        if let Some((kind, n)) = self.stack.last_mut() {
            if *kind == b't' {
                *n += 1;
                return Ok(());
            }
            *n += 1;
            let per = if *kind == EMPTY_DICT { 2 } else { 1 };
            if *n == BATCH * per {
                let op = if *kind == EMPTY_DICT {
                    SETITEMS
                } else {
                    APPENDS
                };
                *n = 0;
                self.w.write_all(&[op, MARK])?;
            }
        }
        Ok(())
    }

    pub fn int(&mut self, v: i64) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.w.write_all(&[BININT1, v as u8])?;
        } else if (0..=0xffff).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.w.write_all(&[BININT2, b[0], b[1]])?;
        } else if (i32::MIN as i64..=i32::MAX as i64).contains(&v) {
            self.w.write_all(&[BININT])?;
            self.w.write_all(&(v as i32).to_le_bytes())?;
        } else {
            self.w.write_all(&[LONG1, 8])?;
            self.w.write_all(&v.to_le_bytes())?;
        }
        self.item_done()
    }

    /// Addresses and sizes: written as i64, as PyTorch's own C++ pickler does.
    pub fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(v as i64)
    }

    pub fn float(&mut self, v: f64) -> io::Result<()> {
        self.w.write_all(&[BINFLOAT])?;
        self.w.write_all(&v.to_be_bytes())?;
        self.item_done()
    }

    pub fn bool(&mut self, v: bool) -> io::Result<()> {
        self.w.write_all(&[if v { NEWTRUE } else { NEWFALSE }])?;
        self.item_done()
    }

    pub fn none(&mut self) -> io::Result<()> {
        self.w.write_all(&[NONE])?;
        self.item_done()
    }

    pub fn str(&mut self, s: &str) -> io::Result<()> {
        self.w.write_all(&[BINUNICODE])?;
        self.w.write_all(&(s.len() as u32).to_le_bytes())?;
        self.w.write_all(s.as_bytes())?;
        self.item_done()
    }

    pub fn dict_begin(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_DICT, MARK])?;
        self.stack.push((EMPTY_DICT, 0));
        Ok(())
    }

    pub fn dict_end(&mut self) -> io::Result<()> {
        self.stack.pop();
        self.w.write_all(&[SETITEMS])?;
        self.item_done()
    }

    pub fn list_begin(&mut self) -> io::Result<()> {
        self.w.write_all(&[EMPTY_LIST, MARK])?;
        self.stack.push((EMPTY_LIST, 0));
        Ok(())
    }

    pub fn list_end(&mut self) -> io::Result<()> {
        self.stack.pop();
        self.w.write_all(&[APPENDS])?;
        self.item_done()
    }

    /// A tuple of any length (written with MARK ... TUPLE).
    pub fn tuple_begin(&mut self) -> io::Result<()> {
        self.w.write_all(&[MARK])?;
        self.stack.push((b't', 0));
        Ok(())
    }

    pub fn tuple_end(&mut self) -> io::Result<()> {
        self.stack.pop();
        self.w.write_all(&[TUPLE])?;
        self.item_done()
    }

    /// `key: int` inside a dict.
    pub fn kv_int(&mut self, k: &str, v: i64) -> io::Result<()> {
        self.str(k)?;
        self.int(v)
    }
    pub fn kv_str(&mut self, k: &str, v: &str) -> io::Result<()> {
        self.str(k)?;
        self.str(v)
    }
}

/// A decoded pickle value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Vec<(Value, Value)>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }
    /// `dict[key]` for a str key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }
}

/// Why a pickle could not be read: the byte offset and the problem.
#[derive(Debug, Clone, PartialEq)]
pub struct PickleError {
    pub offset: u64,
    pub msg: String,
}

enum Slot {
    V(Value),
    Mark,
}

/// Reads one pickle made only of plain data. Never executes anything.
pub fn read(data: &[u8]) -> Result<Value, PickleError> {
    let mut pos = 0usize;
    let mut stack: Vec<Slot> = Vec::new();
    let mut memo: Vec<Option<Value>> = Vec::new();
    let err = |off: usize, msg: String| PickleError {
        offset: off as u64,
        msg,
    };
    macro_rules! take {
        ($n:expr, $at:expr) => {{
            let n: usize = $n;
            if data.len() - pos < n {
                return Err(err(
                    $at,
                    "pickle ends in the middle of an opcode (truncated file?)".into(),
                ));
            }
            let s = &data[pos..pos + n];
            pos += n;
            s
        }};
    }
    fn pop_to_mark(stack: &mut Vec<Slot>) -> Option<Vec<Value>> {
        let mark = stack.iter().rposition(|s| matches!(s, Slot::Mark))?;
        let items = stack.split_off(mark + 1);
        stack.pop();
        Some(
            items
                .into_iter()
                .map(|s| if let Slot::V(v) = s { v } else { Value::None })
                .collect(),
        )
    }
    fn pop_value(stack: &mut Vec<Slot>) -> Option<Value> {
        match stack.pop() {
            Some(Slot::V(v)) => Some(v),
            Some(Slot::Mark) => None,
            None => None,
        }
    }
    fn memo_put(memo: &mut Vec<Option<Value>>, idx: usize, v: Value) {
        if memo.len() <= idx {
            memo.resize(idx + 1, None);
        }
        memo[idx] = Some(v);
    }
    loop {
        let at = pos;
        if pos >= data.len() {
            return Err(err(at, "pickle ends without STOP (truncated file?)".into()));
        }
        let op = data[pos];
        pos += 1;
        match op {
            PROTO => {
                let v = take!(1, at)[0];
                if !(2..=5).contains(&v) {
                    return Err(err(at, format!("unsupported pickle protocol {v}")));
                }
            }
            FRAME => {
                take!(8, at);
            }
            STOP => {
                let v = pop_value(&mut stack)
                    .ok_or_else(|| err(at, "STOP with an empty stack".into()))?;
                return Ok(v);
            }
            MARK => stack.push(Slot::Mark),
            EMPTY_DICT => stack.push(Slot::V(Value::Dict(Vec::new()))),
            EMPTY_LIST => stack.push(Slot::V(Value::List(Vec::new()))),
            EMPTY_TUPLE => stack.push(Slot::V(Value::Tuple(Vec::new()))),
            NONE => stack.push(Slot::V(Value::None)),
            NEWTRUE => stack.push(Slot::V(Value::Bool(true))),
            NEWFALSE => stack.push(Slot::V(Value::Bool(false))),
            BININT => {
                let b = take!(4, at);
                stack.push(Slot::V(Value::Int(
                    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                )));
            }
            BININT1 => {
                let b = take!(1, at);
                stack.push(Slot::V(Value::Int(b[0] as i64)));
            }
            BININT2 => {
                let b = take!(2, at);
                stack.push(Slot::V(Value::Int(u16::from_le_bytes([b[0], b[1]]) as i64)));
            }
            LONG1 => {
                let n = take!(1, at)[0] as usize;
                let b = take!(n, at);
                if n > 8 {
                    // An unsigned 64-bit value needs 9 bytes with a zero sign byte.
                    if n == 9 && b[8] == 0 {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(&b[..8]);
                        stack.push(Slot::V(Value::Int(u64::from_le_bytes(a) as i64)));
                        continue;
                    }
                    return Err(err(
                        at,
                        format!("integer of {n} bytes does not fit in 64 bits"),
                    ));
                }
                let mut a = if n > 0 && b[n - 1] & 0x80 != 0 {
                    [0xffu8; 8]
                } else {
                    [0u8; 8]
                };
                a[..n].copy_from_slice(b);
                stack.push(Slot::V(Value::Int(i64::from_le_bytes(a))));
            }
            BINFLOAT => {
                let b = take!(8, at);
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                stack.push(Slot::V(Value::Float(f64::from_be_bytes(a))));
            }
            BINUNICODE | SHORT_BINUNICODE => {
                let n = if op == BINUNICODE {
                    let b = take!(4, at);
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                } else {
                    take!(1, at)[0] as usize
                };
                let b = take!(n, at);
                let s =
                    std::str::from_utf8(b).map_err(|_| err(at, "string is not UTF-8".into()))?;
                stack.push(Slot::V(Value::Str(s.to_string())));
            }
            APPEND | SETITEM | APPENDS | SETITEMS | DICT | LIST | TUPLE => {
                let items = match op {
                    APPEND => vec![
                        pop_value(&mut stack)
                            .ok_or_else(|| err(at, "APPEND without a value".into()))?,
                    ],
                    SETITEM => {
                        let v = pop_value(&mut stack)
                            .ok_or_else(|| err(at, "SETITEM without a value".into()))?;
                        let k = pop_value(&mut stack)
                            .ok_or_else(|| err(at, "SETITEM without a key".into()))?;
                        vec![k, v]
                    }
                    _ => pop_to_mark(&mut stack)
                        .ok_or_else(|| err(at, "container opcode without MARK".into()))?,
                };
                match op {
                    DICT | LIST | TUPLE => {
                        let v = match op {
                            LIST => Value::List(items),
                            TUPLE => Value::Tuple(items),
                            _ => Value::Dict(
                                pairs(items)
                                    .ok_or_else(|| err(at, "odd number of dict items".into()))?,
                            ),
                        };
                        stack.push(Slot::V(v));
                    }
                    _ => match stack.last_mut() {
                        Some(Slot::V(Value::List(l))) if op == APPEND || op == APPENDS => {
                            l.extend(items)
                        }
                        Some(Slot::V(Value::Dict(d))) if op == SETITEM || op == SETITEMS => d
                            .extend(
                                pairs(items)
                                    .ok_or_else(|| err(at, "odd number of dict items".into()))?,
                            ),
                        _ => {
                            return Err(err(
                                at,
                                "append/setitem on something that is not a list/dict".into(),
                            ));
                        }
                    },
                }
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = (op - TUPLE1 + 1) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(
                        pop_value(&mut stack)
                            .ok_or_else(|| err(at, "tuple of missing values".into()))?,
                    );
                }
                items.reverse();
                stack.push(Slot::V(Value::Tuple(items)));
            }
            MEMOIZE | BINPUT | LONG_BINPUT => {
                let idx = match op {
                    MEMOIZE => memo.len(),
                    BINPUT => take!(1, at)[0] as usize,
                    _ => {
                        let b = take!(4, at);
                        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                    }
                };
                if idx > 1 << 28 {
                    return Err(err(at, "memo index out of range".into()));
                }
                // Containers are memoized before they are filled; a later GET of a container would
                // see the empty version. PyTorch snapshots only GET strings and tuples.
                let v = match stack.last() {
                    Some(Slot::V(v)) => v.clone_shallow(),
                    _ => return Err(err(at, "memo put with an empty stack".into())),
                };
                memo_put(&mut memo, idx, v);
            }
            BINGET | LONG_BINGET => {
                let idx = if op == BINGET {
                    take!(1, at)[0] as usize
                } else {
                    let b = take!(4, at);
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                };
                let v = memo
                    .get(idx)
                    .and_then(|v| v.clone())
                    .ok_or_else(|| err(at, format!("memo {idx} not set")))?;
                stack.push(Slot::V(v));
            }
            other => {
                return Err(err(
                    at,
                    format!(
                        "unsupported pickle opcode 0x{other:02x}{}: only plain dicts, lists, strings and numbers are read",
                        opcode_name(other)
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
    }
}

impl Value {
    /// Clones scalars and tuples; containers become empty (they are memoized before filling).
    fn clone_shallow(&self) -> Value {
        match self {
            Value::List(_) => Value::List(Vec::new()),
            Value::Dict(_) => Value::Dict(Vec::new()),
            v => v.clone(),
        }
    }
}

fn pairs(items: Vec<Value>) -> Option<Vec<(Value, Value)>> {
    if !items.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Some(out)
}

fn opcode_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'i' => "INST",
        b'o' => "OBJ",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8e => "BINBYTES8",
        0x8d => "BINUNICODE8",
        0x8b => "LONG4",
        b'I' => "INT",
        b'L' => "LONG",
        b'F' => "FLOAT",
        b'S' => "STRING",
        b'V' => "UNICODE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.dict_begin().unwrap();
        w.kv_int("a", 5).unwrap();
        w.kv_int("big", 0x7f00_0000_0000).unwrap();
        w.kv_int("neg", -3).unwrap();
        w.str("l").unwrap();
        w.list_begin().unwrap();
        for i in 0..2500 {
            w.int(i).unwrap();
        }
        w.list_end().unwrap();
        w.str("t").unwrap();
        w.tuple_begin().unwrap();
        w.int(1).unwrap();
        w.str("x").unwrap();
        w.tuple_end().unwrap();
        w.str("f").unwrap();
        w.float(0.5).unwrap();
        w.dict_end().unwrap();
        let data = w.finish().unwrap();
        let v = read(&data).unwrap();
        assert_eq!(v.get("a"), Some(&Value::Int(5)));
        assert_eq!(v.get("big"), Some(&Value::Int(0x7f00_0000_0000)));
        assert_eq!(v.get("neg"), Some(&Value::Int(-3)));
        assert_eq!(v.get("l").unwrap().as_list().unwrap().len(), 2500);
        assert_eq!(
            v.get("t"),
            Some(&Value::Tuple(vec![Value::Int(1), Value::Str("x".into())]))
        );
        assert_eq!(v.get("f"), Some(&Value::Float(0.5)));
    }

    #[test]
    fn rejects_code_and_garbage() {
        let e = read(b"\x80\x02cos\nsystem\n.").unwrap_err();
        assert!(e.msg.contains("GLOBAL"), "{}", e.msg);
        assert_eq!(e.offset, 2);
        assert!(read(b"\x80\x02]q").is_err());
        assert!(read(b"").is_err());
        assert!(read(b"\x80\x02e.").is_err());
    }
}
