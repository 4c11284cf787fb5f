//! Typed metadata lookups on an open file. Integer getters accept any stored integer type
//! whose value fits, because converters disagree on widths (`uint32` vs `int32` vs `uint64`);
//! every error names the key, the file and what was found.

use anyhow::{anyhow, bail, Result};

use crate::output::escaped;
use crate::{GgufFile, Value};

impl GgufFile {
    /// The value of `key`, or "missing key `key` in FILE".
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata.get(key).ok_or_else(|| {
            anyhow!(
                "missing key `{}` in {}",
                escaped(key),
                self.path().display()
            )
        })
    }

    fn mismatch(&self, key: &str, v: &Value, expected: &str) -> anyhow::Error {
        anyhow!(
            "key `{}` in {} is {} {v}, expected {expected}",
            escaped(key),
            self.path().display(),
            v.type_name()
        )
    }

    /// The error for element `i`, `v`, of the array key `key`: it is not `expected`.
    fn element_mismatch(&self, key: &str, i: usize, v: &Value, expected: &str) -> anyhow::Error {
        anyhow!(
            "key `{}` in {}: element {i} is {}, expected {expected}",
            escaped(key),
            self.path().display(),
            v.type_name()
        )
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, expected: &str) -> Result<T> {
        let v = self.get(key)?;
        v.as_int()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| self.mismatch(key, v, expected))
    }

    /// An integer key as u32 (any integer type whose value fits).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "an integer that fits uint32")
    }

    /// An integer key as u64 (any integer type whose value fits).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "an integer that fits uint64")
    }

    /// An integer key as i64 (any integer type whose value fits).
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int(key, "an integer that fits int64")
    }

    /// A float key as f32 (`float32`, or `float64` narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.get(key)?;
        v.as_float()
            .map(|f| f as f32)
            .ok_or_else(|| self.mismatch(key, v, "a float"))
    }

    /// A bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.get(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.mismatch(key, v, "a bool")),
        }
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.get(key)?;
        v.as_str().ok_or_else(|| self.mismatch(key, v, "a string"))
    }

    /// An array key of any element type.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.mismatch(key, v, "an array")),
        }
    }

    /// An array-of-strings key.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let a = self.get_array(key)?;
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| self.element_mismatch(key, i, v, "a string"))
            })
            .collect()
    }

    /// An array-of-integers key as i32 (elements of any integer type whose value fits).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let a = self.get_array(key)?;
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_int()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| self.element_mismatch(key, i, v, "an integer"))
            })
            .collect()
    }

    /// The architecture name (`general.architecture`), e.g. `llama`.
    pub fn architecture(&self) -> Result<&str> {
        let arch = self.get_str("general.architecture")?;
        if arch.is_empty() {
            bail!(
                "key `general.architecture` in {} is empty",
                self.path().display()
            );
        }
        Ok(arch)
    }
}
