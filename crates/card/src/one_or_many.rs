//! A list that is almost always one element long (one write segment, one read piece) and
//! only sometimes more (packed commands), kept without a heap allocation in the common
//! case: the per-request path stays allocation-free.

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub fn as_slice(&self) -> &[T] {
        match self {
            OneOrMany::One(x) => std::slice::from_ref(x),
            OneOrMany::Many(v) => v,
        }
    }
}

impl<T> From<Vec<T>> for OneOrMany<T> {
    fn from(mut v: Vec<T>) -> Self {
        if v.len() == 1 {
            OneOrMany::One(v.pop().expect("length checked"))
        } else {
            OneOrMany::Many(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_and_many_read_back_as_slices() {
        assert_eq!(OneOrMany::One(3).as_slice(), &[3]);
        assert_eq!(OneOrMany::from(vec![1, 2]).as_slice(), &[1, 2]);
        assert!(matches!(OneOrMany::from(vec![7]), OneOrMany::One(7)));
        assert!(OneOrMany::<u8>::from(vec![]).as_slice().is_empty());
    }
}
