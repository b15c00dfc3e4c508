//! Dense typed ids over arenas.
//!
//! An id is a `u32` newtype; an [`Arena`] hands them out in order and indexes by
//! them. Nothing is ever removed from an arena: passes that delete build a new graph.

use core::marker::PhantomData;

/// A dense id usable as an arena key.
pub trait EntityId: Copy + Eq + Ord + core::hash::Hash + core::fmt::Debug {
    /// The id with this index.
    fn new(index: usize) -> Self;
    /// The index.
    fn index(self) -> usize;
}

/// Declares a `u32` newtype id.
#[macro_export]
macro_rules! entity_id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(u32);
        impl $crate::entity::EntityId for $name {
            fn new(index: usize) -> Self {
                $name(u32::try_from(index).expect("more than 2^32 entities"))
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

/// A vector indexed by an id type.
#[derive(Clone, Debug, PartialEq)]
pub struct Arena<K: EntityId, V> {
    items: Vec<V>,
    _k: PhantomData<K>,
}

impl<K: EntityId, V> Default for Arena<K, V> {
    fn default() -> Self {
        Arena { items: Vec::new(), _k: PhantomData }
    }
}

impl<K: EntityId, V> Arena<K, V> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends and returns the new id.
    pub fn push(&mut self, v: V) -> K {
        let k = K::new(self.items.len());
        self.items.push(v);
        k
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// The entry, if the id is in range.
    pub fn get(&self, k: K) -> Option<&V> {
        self.items.get(k.index())
    }
    /// Ids and entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> + '_ {
        self.items.iter().enumerate().map(|(i, v)| (K::new(i), v))
    }
    /// Ids in order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        (0..self.items.len()).map(K::new)
    }
    /// Entries in order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.items.iter()
    }
    /// Entries in order, mutably.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.items.iter_mut()
    }
}

impl<K: EntityId, V> core::ops::Index<K> for Arena<K, V> {
    type Output = V;
    fn index(&self, k: K) -> &V {
        &self.items[k.index()]
    }
}

impl<K: EntityId, V> core::ops::IndexMut<K> for Arena<K, V> {
    fn index_mut(&mut self, k: K) -> &mut V {
        &mut self.items[k.index()]
    }
}
