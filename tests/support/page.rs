//! The data a `memlsp` HTML page embeds for its script (`<script id="memlsp-data">`), read the
//! way the script reads it.

/// The page's embedded data, as JSON.
pub fn page_data(html: &str) -> serde_json::Value {
    let open = r#"<script id="memlsp-data" type="application/json">"#;
    let start = html.find(open).expect("data script") + open.len();
    let end = start + html[start..].find("</script>").expect("end of data");
    serde_json::from_str(&html[start..end].replace("<\\/", "</")).expect("page data is JSON")
}
