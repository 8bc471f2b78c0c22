//! Sparse raw image file plus metadata sidecar. (Being written: see the store helper.)

use std::path::Path;

use super::{ImageLayout, Store, StoreError};

/// A card image on disk: `PATH` holds the areas in the layout of `ImageLayout`,
/// `PATH.emmc.toml` holds the layout, the model name and the card's persistent state.
#[derive(Debug)]
pub struct ImageStore {
    layout: ImageLayout,
}

impl ImageStore {
    /// Create a new sparse image and its sidecar. Fails if either exists.
    pub fn create(path: &Path, layout: ImageLayout, model_name: &str) -> Result<Self, StoreError> {
        let _ = (path, model_name);
        Ok(ImageStore { layout })
    }

    /// Open an existing image, checking that it was made for this layout and model.
    pub fn open(path: &Path, layout: ImageLayout, model_name: &str) -> Result<Self, StoreError> {
        let _ = (path, model_name);
        Ok(ImageStore { layout })
    }
}

impl Store for ImageStore {
    fn layout(&self) -> ImageLayout {
        self.layout
    }
    fn read_at(&mut self, _offset: u64, _buf: &mut [u8]) -> Result<(), StoreError> {
        unimplemented!("ImageStore is being written")
    }
    fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> Result<(), StoreError> {
        unimplemented!("ImageStore is being written")
    }
    fn fill(&mut self, _offset: u64, _len: u64, _byte: u8) -> Result<(), StoreError> {
        unimplemented!("ImageStore is being written")
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        unimplemented!("ImageStore is being written")
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        None
    }
    fn save_card_state(&mut self, _state: &toml::Table) -> Result<(), StoreError> {
        unimplemented!("ImageStore is being written")
    }
}
