// ropelab's site: a figure (a.ropelab-zoom, or any content image) opens at its full size in a lightbox over the
// page; Escape, a click or the close button shuts it. Without JavaScript the link opens the PNG itself.
(() => {
  "use strict";
  // Search excerpts are a fetch() of each result's page, which a browser refuses from file:// (the site opened
  // from disk): there the results come without excerpts, and without a console error per result.
  if (location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
    DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
  }
  function open(src, alt) {
    const box = document.createElement("div");
    box.className = "ropelab-lightbox";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-label", alt || "figure at full size");
    const close = document.createElement("button");
    close.className = "ropelab-lightbox-close";
    close.textContent = "✕ close";
    const img = document.createElement("img");
    img.src = src;
    img.alt = alt || "";
    box.append(close, img);
    const shut = () => { box.remove(); document.removeEventListener("keydown", onKey); };
    const onKey = (e) => { if (e.key === "Escape") shut(); };
    box.addEventListener("click", shut);
    document.addEventListener("keydown", onKey);
    document.body.append(box);
    close.focus();
  }
  function wire() {
    // Images the builder did not wrap (the map's key figures, the explorers' default views): wrap them too.
    for (const img of document.querySelectorAll("article.bd-article img")) {
      if (img.closest("a") || img.closest(".ropelab-webexplorer")) continue;
      const a = document.createElement("a");
      a.className = "ropelab-zoom";
      a.href = img.getAttribute("src");
      a.title = "Open the figure at full size";
      img.replaceWith(a);
      a.append(img);
    }
    for (const a of document.querySelectorAll("a.ropelab-zoom")) {
      a.addEventListener("click", (e) => {
        if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;  // a new tab: the link itself
        e.preventDefault();
        const img = a.querySelector("img");
        open(a.href, img ? img.alt : "");
      });
    }
  }
  // Search excerpts: Sphinx's searchtools.js takes a result's text from the page's whole main area, so an excerpt
  // often began with the breadcrumbs or the notebook banner (which is also left out of the index: class no-search).
  // This runs before searchtools.js starts its search (on DOMContentLoaded, registered after this script's).
  function searchExcerpts() {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.ropelabExcerpts) return;
    const original = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(".no-search, .bd-breadcrumbs, .prev-next-area, .bd-header-article, .bd-sidebar-secondary")
        .forEach((el) => el.remove());
      return original(doc.documentElement.outerHTML, anchor);
    };
    Search.ropelabExcerpts = true;
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", searchExcerpts);
    document.addEventListener("DOMContentLoaded", wire);
  } else {
    searchExcerpts();
    wire();
  }
})();
