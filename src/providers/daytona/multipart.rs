//! `multipart/form-data` bodies, both ways: Daytona's toolbox takes uploads and answers
//! downloads in this form, so the adapter writes and reads it and so does the emulator.

/// One part of a form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The `name` of its `Content-Disposition`.
    pub name: String,
    /// The `filename`, when it has one (RFC 5987 `filename*` decoded).
    pub filename: Option<String>,
    /// Its `Content-Type`, when given.
    pub content_type: Option<String>,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Part {
    /// A text field.
    pub fn field(name: &str, value: &str) -> Self {
        Self {
            name: name.into(),
            filename: None,
            content_type: None,
            data: value.as_bytes().to_vec(),
        }
    }

    /// A file.
    pub fn file(name: &str, filename: &str, data: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            filename: Some(filename.into()),
            content_type: Some("application/octet-stream".into()),
            data,
        }
    }
}

/// A fresh boundary.
pub fn boundary() -> String {
    format!("rakazo-{}", uuid::Uuid::new_v4().simple())
}

/// The `Content-Type` of a body with `boundary`.
pub fn content_type(boundary: &str) -> String {
    format!("multipart/form-data; boundary={boundary}")
}

fn quote(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace(['\r', '\n'], " ")
}

/// The body of `parts` with `boundary`, closing boundary included.
pub fn encode(boundary: &str, parts: &[Part]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let mut disposition = format!(
            "Content-Disposition: form-data; name=\"{}\"",
            quote(&p.name)
        );
        if let Some(f) = &p.filename {
            disposition.push_str(&format!("; filename=\"{}\"", quote(f)));
        }
        out.extend_from_slice(disposition.as_bytes());
        out.extend_from_slice(b"\r\n");
        if let Some(ct) = &p.content_type {
            out.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&p.data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// The boundary named by a `Content-Type` header, when it is `multipart/form-data`.
pub fn boundary_of(content_type: &str) -> Option<String> {
    let mut fields = content_type.split(';');
    if !fields
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    fields.find_map(|f| {
        let (k, v) = f.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty() && b.len() <= 200)
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (from..=hay.len() - needle.len()).find(|&i| &hay[i..i + needle.len()] == needle)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The value of `key` in a `Content-Disposition` header (quoted or not).
fn disposition_param(header: &str, key: &str) -> Option<String> {
    let mut rest = header;
    while let Some(pos) = rest.find(';') {
        rest = rest[pos + 1..].trim_start();
        let (k, v) = rest.split_once('=')?;
        let v = v.trim_start();
        let (value, after) = if let Some(q) = v.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end..])
        } else {
            let end = v.find(';').unwrap_or(v.len());
            (v[..end].trim().to_string(), &v[end..])
        };
        if k.trim().eq_ignore_ascii_case(key) {
            return Some(value);
        }
        rest = after;
    }
    None
}

/// The parts of `body`; `None` when it is not a complete form with `boundary` (a missing
/// closing boundary included) or holds more than `max_parts` parts.
pub fn decode(body: &[u8], boundary: &str, max_parts: usize) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}");
    let mut pos = find(body, delimiter.as_bytes(), 0)? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        if body.get(pos..pos + 2) == Some(b"--") {
            return Some(parts);
        }
        if body.get(pos..pos + 2) != Some(b"\r\n") {
            return None;
        }
        pos += 2;
        let head_end = find(body, b"\r\n\r\n", pos)?;
        let head = std::str::from_utf8(&body[pos..head_end]).ok()?;
        let next = find(body, format!("\r\n{delimiter}").as_bytes(), head_end + 4)?;
        let data = body[head_end + 4..next].to_vec();
        let (mut name, mut filename, mut content_type) = (None, None, None);
        for line in head.split("\r\n") {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                name = disposition_param(v, "name");
                filename = disposition_param(v, "filename*")
                    .and_then(|f| {
                        let (charset, rest) = f.split_once("''")?;
                        charset
                            .eq_ignore_ascii_case("utf-8")
                            .then(|| percent_decode(rest))?
                    })
                    .or_else(|| disposition_param(v, "filename"));
            } else if k.trim().eq_ignore_ascii_case("content-type") {
                content_type = Some(v.to_string());
            }
        }
        parts.push(Part {
            name: name?,
            filename,
            content_type,
            data,
        });
        if parts.len() > max_parts {
            return None;
        }
        pos = next + 2 + delimiter.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_round_trips_with_binary_data_and_odd_names() {
        let b = boundary();
        let parts = vec![
            Part::field("files[0].path", "/home/u/a \"b\".txt"),
            Part::file(
                "files[0].file",
                "/home/u/a \"b\".txt",
                vec![0, 13, 10, 45, 45, 255],
            ),
        ];
        let body = encode(&b, &parts);
        let back = decode(&body, &b, 10).unwrap();
        assert_eq!(back, parts);
        assert_eq!(boundary_of(&content_type(&b)).as_deref(), Some(b.as_str()));
    }

    #[test]
    fn a_truncated_body_or_too_many_parts_is_refused() {
        let b = boundary();
        let body = encode(&b, &[Part::field("a", "1"), Part::field("b", "2")]);
        assert!(decode(&body[..body.len() - 8], &b, 10).is_none());
        assert!(decode(&body, &b, 1).is_none());
        assert!(boundary_of("application/json").is_none());
    }

    #[test]
    fn rfc5987_file_names_are_decoded() {
        let body = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename*=utf-8''a%20%C3%A9.txt\r\n\r\nhi\r\n--x--\r\n";
        let parts = decode(body, "x", 4).unwrap();
        assert_eq!(parts[0].filename.as_deref(), Some("a é.txt"));
        assert_eq!(parts[0].data, b"hi");
    }
}
