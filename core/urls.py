from django.urls import path

from . import views

app_name = "docs"
urlpatterns = [
    path("", views.docs_index, name="index"),
    path("<slug:name>/", views.doc_page, name="page"),
]
