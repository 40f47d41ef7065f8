//! The pickle subset PyTorch memory snapshots use, both ways.
//!
//! The writer emits only opcodes that PyTorch's MemoryViz.js `unpickle()` accepts (protocol 2,
//! dicts, lists, tuples, str, ints as BININT*/8-byte LONG1, floats, bools, None): no bytes, no
//! LONG4, no globals. The reader accepts what `pickle.dump` of such a dict produces under any
//! protocol 2-5 (framing and memo included) and rejects everything else (no GLOBAL/REDUCE: it
//! never runs code).

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::rc::Rc;

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

/// A decoded pickle value. Strings are shared: a memoized string fetched again (PyTorch
/// snapshots fetch every frame's file name that way) costs one reference, not a copy.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
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
                .find(|(k, _)| matches!(k, Value::Str(s) if &**s == key))
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

/// The largest pickle read (a memory snapshot of 100,000 entries with deep stacks is a few
/// hundred MiB).
pub const MAX_PICKLE_BYTES: u64 = 4 << 30;
/// The deepest nesting of lists, dicts and tuples (a snapshot nests 7 deep). Bounds the
/// recursion of everything that walks or drops a value.
pub const MAX_DEPTH: u32 = 100;
/// The memory the decoded values may take: this much, plus [`BUDGET_PER_BYTE`] per byte read.
/// Plain data costs at most 32 bytes per pickle byte (a 1-byte opcode makes a 32-byte value);
/// only a pickle that fetches the same big tuple over and over (a memo bomb) goes past it.
pub const BASE_BUDGET: u64 = 64 << 20;
pub const BUDGET_PER_BYTE: u64 = 64;
/// The most memo entries (a snapshot memoizes each distinct string and container once).
pub const MAX_MEMO: usize = 1 << 24;

/// What one decoded value costs: its own size, and for a tuple (the only container fetched
/// from the memo whole) what its items cost.
const VALUE_COST: u64 = std::mem::size_of::<Value>() as u64;

#[derive(Clone, Copy, Default)]
struct Meta {
    /// Levels of containers, this one included (0 for a scalar, 1 for a flat list).
    depth: u32,
    /// Bytes a copy of the value costs, items included (strings are shared: a copy of one
    /// costs `VALUE_COST`).
    cost: u64,
}

const SCALAR: Meta = Meta {
    depth: 0,
    cost: VALUE_COST,
};

const EMPTY: Meta = Meta {
    depth: 1,
    cost: VALUE_COST,
};

enum Slot {
    V(Value, Meta),
    Mark,
}

/// Reads one pickle made only of plain data. Never executes anything.
pub fn read(data: &[u8]) -> Result<Value, PickleError> {
    read_from(data)
}

/// [`read`] from a stream: bytes are read as the opcodes need them, so garbage is refused at
/// its first byte and memory stays within [`MAX_DEPTH`], [`MAX_MEMO`], the budget and
/// [`MAX_PICKLE_BYTES`] whatever the input.
pub fn read_from<R: BufRead>(r: R) -> Result<Value, PickleError> {
    Parser {
        r,
        pos: 0,
        cost: 0,
        buf: Vec::new(),
    }
    .run()
}

struct Parser<R> {
    r: R,
    /// Bytes consumed.
    pos: u64,
    /// Bytes of values made so far (never decreases: what was made was allocated).
    cost: u64,
    buf: Vec<u8>,
}

fn err(at: u64, msg: impl Into<String>) -> PickleError {
    PickleError {
        offset: at,
        msg: msg.into(),
    }
}

impl<R: BufRead> Parser<R> {
    /// Charges `n` bytes of decoded values against the budget.
    fn charge(&mut self, at: u64, n: u64) -> Result<(), PickleError> {
        self.cost = self.cost.saturating_add(n);
        let budget = BASE_BUDGET.saturating_add(self.pos.saturating_mul(BUDGET_PER_BYTE));
        if self.cost > budget {
            return Err(err(
                at,
                format!(
                    "the decoded values would take more than {} MiB of memory after {} bytes of \
                     pickle (the limit is {} MiB plus {BUDGET_PER_BYTE} bytes per pickle byte): \
                     shared references expanded over and over (a memo bomb?)",
                    self.cost >> 20,
                    self.pos,
                    BASE_BUDGET >> 20
                ),
            ));
        }
        Ok(())
    }

    /// The next `n` bytes of the opcode that starts at `at`.
    fn take(&mut self, n: u64, at: u64) -> Result<&[u8], PickleError> {
        let want = n.min(MAX_PICKLE_BYTES.saturating_sub(self.pos));
        self.buf.clear();
        let got = (&mut self.r)
            .take(want)
            .read_to_end(&mut self.buf)
            .map_err(|e| err(self.pos, format!("cannot read: {e}")))?;
        self.pos += got as u64;
        if (got as u64) < want {
            return Err(err(
                at,
                "pickle ends in the middle of an opcode (truncated file?)",
            ));
        }
        if want < n {
            return Err(err(
                at,
                format!(
                    "the pickle goes past {} GiB, the largest memory snapshot read",
                    MAX_PICKLE_BYTES >> 30
                ),
            ));
        }
        Ok(&self.buf)
    }

    fn take_array<const N: usize>(&mut self, at: u64) -> Result<[u8; N], PickleError> {
        let b = self.take(N as u64, at)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn push(&mut self, stack: &mut Vec<Slot>, at: u64, v: Value) -> Result<(), PickleError> {
        self.charge(at, VALUE_COST)?;
        stack.push(Slot::V(v, SCALAR));
        Ok(())
    }

    fn push_empty(&mut self, stack: &mut Vec<Slot>, at: u64, v: Value) -> Result<(), PickleError> {
        self.charge(at, VALUE_COST)?;
        stack.push(Slot::V(v, EMPTY));
        Ok(())
    }

    fn run(mut self) -> Result<Value, PickleError> {
        let mut stack: Vec<Slot> = Vec::new();
        let mut memo: HashMap<u32, (Value, Meta)> = HashMap::new();
        fn pop_to_mark(stack: &mut Vec<Slot>) -> Option<Vec<(Value, Meta)>> {
            let mark = stack.iter().rposition(|s| matches!(s, Slot::Mark))?;
            let items = stack.split_off(mark + 1);
            stack.pop();
            Some(
                items
                    .into_iter()
                    .map(|s| match s {
                        Slot::V(v, m) => (v, m),
                        Slot::Mark => (Value::None, SCALAR),
                    })
                    .collect(),
            )
        }
        fn pop_value(stack: &mut Vec<Slot>) -> Option<(Value, Meta)> {
            match stack.pop() {
                Some(Slot::V(v, m)) => Some((v, m)),
                Some(Slot::Mark) => None,
                None => None,
            }
        }
        /// The depth of a container of `items`, refused past [`MAX_DEPTH`].
        fn container_depth(at: u64, items: &[(Value, Meta)]) -> Result<u32, PickleError> {
            let depth = 1 + items.iter().map(|(_, m)| m.depth).max().unwrap_or(0);
            if depth > MAX_DEPTH {
                return Err(err(
                    at,
                    format!(
                        "lists, dicts and tuples nested more than {MAX_DEPTH} deep (a memory \
                         snapshot nests 7)"
                    ),
                ));
            }
            Ok(depth)
        }
        loop {
            let at = self.pos;
            let op = match self.take(1, at) {
                Ok(b) => b[0],
                Err(e) if e.msg.starts_with("pickle ends") => {
                    return Err(err(at, "pickle ends without STOP (truncated file?)"));
                }
                Err(e) => return Err(e),
            };
            match op {
                PROTO => {
                    let v = self.take(1, at)?[0];
                    if !(2..=5).contains(&v) {
                        return Err(err(at, format!("unsupported pickle protocol {v}")));
                    }
                }
                FRAME => {
                    self.take(8, at)?;
                }
                STOP => {
                    let (v, _) =
                        pop_value(&mut stack).ok_or_else(|| err(at, "STOP with an empty stack"))?;
                    return Ok(v);
                }
                MARK => {
                    self.charge(at, VALUE_COST)?;
                    stack.push(Slot::Mark);
                }
                EMPTY_DICT => self.push_empty(&mut stack, at, Value::Dict(Vec::new()))?,
                EMPTY_LIST => self.push_empty(&mut stack, at, Value::List(Vec::new()))?,
                EMPTY_TUPLE => self.push_empty(&mut stack, at, Value::Tuple(Vec::new()))?,
                NONE => self.push(&mut stack, at, Value::None)?,
                NEWTRUE => self.push(&mut stack, at, Value::Bool(true))?,
                NEWFALSE => self.push(&mut stack, at, Value::Bool(false))?,
                BININT => {
                    let v = i32::from_le_bytes(self.take_array(at)?) as i64;
                    self.push(&mut stack, at, Value::Int(v))?;
                }
                BININT1 => {
                    let v = self.take(1, at)?[0] as i64;
                    self.push(&mut stack, at, Value::Int(v))?;
                }
                BININT2 => {
                    let v = u16::from_le_bytes(self.take_array(at)?) as i64;
                    self.push(&mut stack, at, Value::Int(v))?;
                }
                LONG1 => {
                    let n = self.take(1, at)?[0] as usize;
                    let b = self.take(n as u64, at)?;
                    let v = if n > 8 {
                        // An unsigned 64-bit value needs 9 bytes with a zero sign byte.
                        if n == 9 && b[8] == 0 {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(&b[..8]);
                            u64::from_le_bytes(a) as i64
                        } else {
                            return Err(err(
                                at,
                                format!("integer of {n} bytes does not fit in 64 bits"),
                            ));
                        }
                    } else {
                        let mut a = if n > 0 && b[n - 1] & 0x80 != 0 {
                            [0xffu8; 8]
                        } else {
                            [0u8; 8]
                        };
                        a[..n].copy_from_slice(b);
                        i64::from_le_bytes(a)
                    };
                    self.push(&mut stack, at, Value::Int(v))?;
                }
                BINFLOAT => {
                    let v = f64::from_be_bytes(self.take_array(at)?);
                    self.push(&mut stack, at, Value::Float(v))?;
                }
                BINUNICODE | SHORT_BINUNICODE => {
                    let n = if op == BINUNICODE {
                        u32::from_le_bytes(self.take_array(at)?) as u64
                    } else {
                        self.take(1, at)?[0] as u64
                    };
                    // `take` grows its buffer with what the file holds: a length the file
                    // does not back is refused at its end, not allocated up front.
                    let b = self.take(n, at)?;
                    let s = std::str::from_utf8(b).map_err(|_| err(at, "string is not UTF-8"))?;
                    let v = Value::Str(Rc::from(s));
                    self.charge(at, n)?;
                    self.push(&mut stack, at, v)?;
                }
                APPEND | SETITEM | APPENDS | SETITEMS | DICT | LIST | TUPLE => {
                    let items = match op {
                        APPEND => vec![
                            pop_value(&mut stack)
                                .ok_or_else(|| err(at, "APPEND without a value"))?,
                        ],
                        SETITEM => {
                            let v = pop_value(&mut stack)
                                .ok_or_else(|| err(at, "SETITEM without a value"))?;
                            let k = pop_value(&mut stack)
                                .ok_or_else(|| err(at, "SETITEM without a key"))?;
                            vec![k, v]
                        }
                        _ => pop_to_mark(&mut stack)
                            .ok_or_else(|| err(at, "container opcode without MARK"))?,
                    };
                    let depth = container_depth(at, &items)?;
                    match op {
                        DICT | LIST | TUPLE => {
                            let cost = items_cost(&items);
                            let values = items.into_iter().map(|(v, _)| v).collect();
                            let v = match op {
                                LIST => Value::List(values),
                                TUPLE => Value::Tuple(values),
                                _ => Value::Dict(
                                    pairs(values)
                                        .ok_or_else(|| err(at, "odd number of dict items"))?,
                                ),
                            };
                            self.charge(at, VALUE_COST)?;
                            stack.push(Slot::V(v, Meta { depth, cost }));
                        }
                        _ => {
                            let added = items_cost(&items) - VALUE_COST;
                            let values = items.into_iter().map(|(v, _)| v).collect::<Vec<_>>();
                            match stack.last_mut() {
                                Some(Slot::V(Value::List(l), m))
                                    if op == APPEND || op == APPENDS =>
                                {
                                    m.depth = m.depth.max(depth);
                                    m.cost = m.cost.saturating_add(added);
                                    l.extend(values)
                                }
                                Some(Slot::V(Value::Dict(d), m))
                                    if op == SETITEM || op == SETITEMS =>
                                {
                                    m.depth = m.depth.max(depth);
                                    m.cost = m.cost.saturating_add(added);
                                    d.extend(
                                        pairs(values)
                                            .ok_or_else(|| err(at, "odd number of dict items"))?,
                                    )
                                }
                                _ => {
                                    return Err(err(
                                        at,
                                        "append/setitem on something that is not a list/dict",
                                    ));
                                }
                            }
                        }
                    }
                }
                TUPLE1 | TUPLE2 | TUPLE3 => {
                    let n = (op - TUPLE1 + 1) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(
                            pop_value(&mut stack)
                                .ok_or_else(|| err(at, "tuple of missing values"))?,
                        );
                    }
                    items.reverse();
                    let depth = container_depth(at, &items)?;
                    let cost = items_cost(&items);
                    let v = Value::Tuple(items.into_iter().map(|(v, _)| v).collect());
                    self.charge(at, VALUE_COST)?;
                    stack.push(Slot::V(v, Meta { depth, cost }));
                }
                MEMOIZE | BINPUT | LONG_BINPUT => {
                    let idx = match op {
                        MEMOIZE => memo.len() as u32,
                        BINPUT => self.take(1, at)?[0] as u32,
                        _ => u32::from_le_bytes(self.take_array(at)?),
                    };
                    if memo.len() >= MAX_MEMO && !memo.contains_key(&idx) {
                        return Err(err(at, format!("more than {MAX_MEMO} memo entries")));
                    }
                    // Containers are memoized before they are filled; a later GET of a
                    // container would see the empty version. PyTorch snapshots only GET
                    // strings and tuples.
                    let (v, m) = match stack.last() {
                        Some(Slot::V(v, m)) => v.clone_shallow(*m),
                        _ => return Err(err(at, "memo put with an empty stack")),
                    };
                    self.charge(at, m.cost.saturating_add(VALUE_COST))?;
                    memo.insert(idx, (v, m));
                }
                BINGET | LONG_BINGET => {
                    let idx = if op == BINGET {
                        self.take(1, at)?[0] as u32
                    } else {
                        u32::from_le_bytes(self.take_array(at)?)
                    };
                    let m = match memo.get(&idx) {
                        Some((_, m)) => *m,
                        None => return Err(err(at, format!("memo {idx} not set"))),
                    };
                    // Charged before the copy is made: a memo bomb stops here.
                    self.charge(at, m.cost)?;
                    let v = memo[&idx].0.clone();
                    stack.push(Slot::V(v, m));
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
}

/// What a copy of a container of `items` costs.
fn items_cost(items: &[(Value, Meta)]) -> u64 {
    items
        .iter()
        .fold(VALUE_COST, |c, (_, m)| c.saturating_add(m.cost))
}

impl Value {
    /// Clones scalars, strings (shared) and tuples; containers become empty (they are
    /// memoized before filling).
    fn clone_shallow(&self, m: Meta) -> (Value, Meta) {
        match self {
            Value::List(_) => (Value::List(Vec::new()), EMPTY),
            Value::Dict(_) => (Value::Dict(Vec::new()), EMPTY),
            v => (v.clone(), m),
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
    fn limits() {
        // Nesting: 100 levels read, 101 refused at the append that makes the 101st.
        let nested = |n: usize| {
            let mut p = vec![PROTO, 2];
            p.extend(std::iter::repeat_n(EMPTY_LIST, n));
            p.extend(std::iter::repeat_n(APPEND, n - 1));
            p.push(STOP);
            p
        };
        assert!(read(&nested(100)).is_ok());
        let e = read(&nested(101)).unwrap_err();
        assert!(e.msg.contains("nested more than 100 deep"), "{}", e.msg);
        assert_eq!(e.offset, 2 + 101 + 99);
        // Any memo index, no memory for the ones not used.
        let v = read(b"\x80\x02Nr\xff\xff\xff\xffj\xff\xff\xff\xff.").unwrap();
        assert_eq!(v, Value::None);
        // A memo bomb stops at the budget, with the offset of the fetch that went past it.
        let mut bomb = b"\x80\x02Nq\x00".to_vec();
        for i in 0..40u8 {
            bomb.extend_from_slice(&[BINGET, i, BINGET, i, TUPLE2, BINPUT, i + 1]);
        }
        bomb.push(STOP);
        let e = read(&bomb).unwrap_err();
        assert!(e.msg.contains("memo bomb"), "{}", e.msg);
        assert!(
            e.offset > 5 && (e.offset as usize) < bomb.len(),
            "{}",
            e.offset
        );
        // A length the file does not back: truncated, nothing allocated for it.
        let e = read(b"\x80\x02X\xff\xff\xff\xffabc").unwrap_err();
        assert!(e.msg.contains("truncated"), "{}", e.msg);
        // Shared strings: fetching one a million times costs a reference each.
        let mut many = b"\x80\x02(X\x00\x04\x00\x00".to_vec();
        many.extend(std::iter::repeat_n(b'x', 1024));
        many.extend_from_slice(b"q\x00");
        for _ in 0..1_000_000 {
            many.extend_from_slice(&[BINGET, 0]);
        }
        many.extend_from_slice(b"l.");
        assert_eq!(read(&many).unwrap().as_list().unwrap().len(), 1_000_001);
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
