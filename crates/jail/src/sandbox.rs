//! (being written)
#[derive(Debug)]
pub struct Sandbox;
#[derive(Debug)]
pub struct SpawnOptions;
#[derive(Debug)]
pub struct Exit;
