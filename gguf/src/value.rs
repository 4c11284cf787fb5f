//! GGUF metadata values: the closed set of types a key can hold, their on-disk type ids, and
//! lossless accessors that the typed `GgufFile::get_*` lookups build on.

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float32`
    F32(f32),
    /// `float64`
    F64(f64),
    /// `bool`, stored as one byte 0 or 1.
    Bool(bool),
    /// UTF-8 string (invalid sequences in a file are replaced by U+FFFD).
    Str(String),
    /// Array of values that all share one type.
    Array(Vec<Value>),
}

/// GGUF value type ids.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STR: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl Value {
    /// The GGUF type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F32(_) => type_id::F32,
            Value::F64(_) => type_id::F64,
            Value::Bool(_) => type_id::BOOL,
            Value::Str(_) => type_id::STR,
            Value::Array(_) => type_id::ARRAY,
        }
    }

    /// The GGUF spelling of this value's type, for error messages (`uint32`, `string`, ...).
    pub fn type_name(&self) -> &'static str {
        type_name(self.type_id())
    }

    /// The value as an i128 if it is any integer type (never lossy).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an f64 if it is a float type.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The GGUF spelling of a value type id.
pub(crate) fn type_name(id: u32) -> &'static str {
    match id {
        type_id::U8 => "uint8",
        type_id::I8 => "int8",
        type_id::U16 => "uint16",
        type_id::I16 => "int16",
        type_id::U32 => "uint32",
        type_id::I32 => "int32",
        type_id::F32 => "float32",
        type_id::BOOL => "bool",
        type_id::STR => "string",
        type_id::ARRAY => "array",
        type_id::U64 => "uint64",
        type_id::I64 => "int64",
        type_id::F64 => "float64",
        _ => "unknown",
    }
}

/// Fewest bytes one value of type `id` can take in a file; `None` for unknown ids.
pub(crate) fn min_encoded_len(id: u32) -> Option<u64> {
    Some(match id {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 | type_id::STR => 8,
        type_id::ARRAY => 12,
        _ => return None,
    })
}

impl std::fmt::Display for Value {
    /// Short human form: numbers as written, strings quoted (control characters escaped),
    /// arrays by length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Str(s) => write!(f, "\"{}\"", crate::output::escaped(s)),
            Value::Array(a) => write!(f, "[{} items]", a.len()),
            Value::Bool(b) => write!(f, "{b}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            v => write!(f, "{}", v.as_int().unwrap_or_default()),
        }
    }
}
