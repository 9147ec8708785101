"""Difference imaging: image pairs -> ZOGY difference -> detections -> cutouts, fits, scores."""
