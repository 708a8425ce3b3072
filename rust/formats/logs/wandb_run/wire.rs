//! Protocol Buffers' wire format, read field by field: just enough to pull
//! W&B's history and run records out of a `.wandb` log without a schema
//! compiler. Every step consumes at least one byte of a slice, so a walk
//! over hostile bytes ends; a malformed field ends the walk with `None`.

/// One field's value as it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The fields of one message, in wire order.
pub struct Fields<'a> {
    rest: &'a [u8],
    /// Set when a field did not read: what follows it is not trusted.
    pub malformed: bool,
}

impl<'a> Fields<'a> {
    pub fn new(message: &'a [u8]) -> Fields<'a> {
        Fields {
            rest: message,
            malformed: false,
        }
    }
}

/// A varint at the start of `bytes` and how many bytes it took (at most 10).
pub fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A `sint64`'s value from its zigzag encoding.
pub fn zigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, Wire<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.malformed {
            return None;
        }
        let field = self.read_field();
        if field.is_none() {
            self.malformed = true;
        }
        field
    }
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn read_varint(&mut self) -> Option<u64> {
        let (value, used) = varint(self.rest)?;
        self.rest = &self.rest[used..];
        Some(value)
    }

    fn read_field(&mut self) -> Option<(u64, Wire<'a>)> {
        let key = self.read_varint()?;
        let number = key >> 3;
        if number == 0 {
            return None;
        }
        let value = match key & 7 {
            0 => Wire::Varint(self.read_varint()?),
            1 => Wire::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().ok()?)),
            2 => {
                let len = usize::try_from(self.read_varint()?).ok()?;
                Wire::Bytes(self.take(len)?)
            }
            5 => Wire::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            // Groups (3, 4) are long deprecated and W&B writes none; 6 and 7
            // are no wire type at all.
            _ => return None,
        };
        Some((number, value))
    }
}

/// `n` as a varint: the writer's side, for test data and fuzz seeds.
pub fn encode_varint(mut n: u64) -> Vec<u8> {
    let mut out = vec![];
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Field `field` holding `data`, length-delimited (the writer's side).
pub fn encode_bytes(field: u64, data: &[u8]) -> Vec<u8> {
    let mut out = encode_varint(field << 3 | 2);
    out.extend(encode_varint(data.len() as u64));
    out.extend_from_slice(data);
    out
}

/// A length-delimited field as UTF-8 text (lossy: a name is for showing).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_read_as_protobuf_writes_them() {
        assert_eq!(varint(&[0x01]), Some((1, 1)));
        assert_eq!(varint(&[0xac, 0x02]), Some((300, 2)));
        assert_eq!(varint(&[0x80]), None, "a varint cut short");
        assert_eq!(varint(&[0xff; 11]), None, "longer than ten bytes");
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(1), -1);
        assert_eq!(zigzag(4), 2);
        assert_eq!(zigzag(u64::MAX), i64::MIN);
    }

    #[test]
    fn fields_of_each_wire_type() {
        // field 1 varint 150; field 2 bytes "hi"; field 3 fixed64; field 4 fixed32.
        let mut m = vec![0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i', 0x19];
        m.extend(2.5f64.to_le_bytes());
        m.push(0x25);
        m.extend(7u32.to_le_bytes());
        let got: Vec<_> = Fields::new(&m).collect();
        assert_eq!(
            got,
            vec![
                (1, Wire::Varint(150)),
                (2, Wire::Bytes(b"hi")),
                (3, Wire::Fixed64(2.5f64.to_bits())),
                (4, Wire::Fixed32(7)),
            ]
        );
    }

    #[test]
    fn a_malformed_field_ends_the_walk() {
        // A length past the end, a group, field number 0.
        for bad in [&[0x12, 0x05, b'a'][..], &[0x0b], &[0x00, 0x01]] {
            let mut fields = Fields::new(bad);
            assert_eq!(fields.next(), None);
            assert!(fields.malformed);
        }
    }
}
