//! zstd-compressed layers (`application/vnd.oci.image.layer.v1.tar+zstd`),
//! decoded in pure Rust (ruzstd).
//!
//! ruzstd's `StreamingDecoder` reads one frame, but a zstd stream may be
//! several frames back to back, with skippable frames between them (the
//! `zstd:chunked` layers of podman are built that way). Stopping after the
//! first frame would look like a short tar, so every frame is decoded, as
//! `zstd -d` does, and skippable frames are skipped. The decoder's window
//! is ruzstd's default maximum, which bounds the memory a hostile frame can
//! ask for.

use std::io::{self, BufRead, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// Decodes all the frames of `source`.
pub struct ZstdFrames<R> {
    source: R,
    decoder: FrameDecoder,
    /// A frame is being decoded.
    in_frame: bool,
}

impl<R: BufRead> ZstdFrames<R> {
    pub fn new(source: R) -> Self {
        ZstdFrames {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.in_frame {
                while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                    self.decoder
                        .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                        .map_err(io::Error::other)?;
                }
                let n = self.decoder.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                self.in_frame = false;
            }
            if self.source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            match self.decoder.init(&mut self.source) {
                Ok(()) => self.in_frame = true,
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let want = u64::from(length);
                    let skipped = io::copy(&mut (&mut self.source).take(want), &mut io::sink())?;
                    if skipped != want {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};

    #[test]
    fn every_frame_is_decoded_and_skippable_frames_are_skipped() {
        let mut stream = compress_to_vec(&b"first "[..], CompressionLevel::Fastest);
        // A skippable frame: magic 0x184D2A50, a length, then that many bytes.
        stream.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        stream.extend_from_slice(&3u32.to_le_bytes());
        stream.extend_from_slice(b"xyz");
        stream.extend(compress_to_vec(&b"second"[..], CompressionLevel::Fastest));
        let mut out = Vec::new();
        ZstdFrames::new(&stream[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"first second");
    }

    #[test]
    fn garbage_after_a_frame_is_an_error() {
        let mut stream = compress_to_vec(&b"data"[..], CompressionLevel::Fastest);
        stream.extend_from_slice(b"not zstd at all");
        let mut out = Vec::new();
        assert!(ZstdFrames::new(&stream[..]).read_to_end(&mut out).is_err());
    }
}
